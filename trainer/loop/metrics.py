"""Prometheus metrics of ``agl-bridge loop``: rounds, gate decisions, publishes, rollbacks and
the versions live now, kept by a ``LoopCallback`` (the loop's engine is not touched) in a
registry of its own, with the spans this process's exporters lost (``otel/metrics.py``).

Counters start at zero with the process, as Prometheus expects of a restart (its ``rate`` and
``increase`` handle resets); ``agl_bridge_loop_round`` says which round a resumed loop is at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agl_bridge.otel.metrics import PREFIX, ExportLossCollector, require
from agl_bridge.trainer.loop.engine import Loop, LoopCallback


class MetricsCallback(LoopCallback):
    """Counts what each round did (its record) and shows the live versions."""

    def __init__(self) -> None:
        client = require()
        self.registry = client.CollectorRegistry()
        name = f"{PREFIX}_loop"
        self.rounds = client.Counter(f"{name}_rounds", "rounds ended", registry=self.registry)
        self.round = client.Gauge(f"{name}_round", "the last round that ended (from 0)",
                                  registry=self.registry)
        self.round_seconds = client.Gauge(f"{name}_round_seconds", "how long the last round "
                                          "took", registry=self.registry)
        self.gate = client.Counter(f"{name}_gate_decisions", "gate decisions on a candidate: "
                                   "publish or refuse", ["decision"], registry=self.registry)
        for decision in ("publish", "refuse"):
            self.gate.labels(decision)  # both series exist from the start, at 0
        self.publishes = client.Counter(f"{name}_publishes", "rounds that published versions",
                                        registry=self.registry)
        self.rollbacks = client.Counter(f"{name}_rollbacks", "live versions rolled back by "
                                        "the watch", registry=self.registry)
        self.trainings = client.Counter(f"{name}_trainings", "training stages, by outcome: "
                                        "trained, or nothing to train on", ["outcome"],
                                        registry=self.registry)
        for outcome in ("trained", "nothing"):
            self.trainings.labels(outcome)
        self.live = client.Gauge(f"{name}_live_version", "1 for the version each alias serves "
                                 "now", ["alias", "version"], registry=self.registry)
        self.registry.register(ExportLossCollector())
        self._shown: dict[str, str] = {}

    def _show_live(self, loop: Loop) -> None:
        live = {str(a): str(v) for a, v in loop.data.get("live", {}).items()}
        for alias, version in self._shown.items():
            if live.get(alias) != version:
                self.live.remove(alias, version)
        for alias, version in live.items():
            self.live.labels(alias, version).set(1)
        self._shown = live

    def on_evaluate(self, loop: Loop, label: str, out: Path) -> None:
        self._show_live(loop)

    def on_train_begin(self, loop: Loop) -> None:
        self._show_live(loop)

    def on_round_end(self, loop: Loop, directory: Path, record: dict[str, Any]) -> None:
        self.rounds.inc()
        self.round.set(record.get("round", 0))
        self.round_seconds.set(record.get("seconds", 0.0))
        gate = record.get("gate")
        if isinstance(gate, dict) and "publish" in gate:
            self.gate.labels("publish" if gate["publish"] else "refuse").inc()
        if record.get("published"):
            self.publishes.inc()
        if record.get("rolled_back"):
            self.rollbacks.inc()
        if "trained" in record:
            self.trainings.labels("trained" if record["trained"] else "nothing").inc()
        self._show_live(loop)
