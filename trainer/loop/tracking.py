"""The loop's rounds in MLflow and TensorBoard: a ``LoopCallback`` that reports what the loop
records.

``[train] report_to`` chooses the tools for the rounds as for each round's training (one
setting, read by both). The loop's run holds its settings (``train.learning_rate``, ...), per
round (the step is the round's number) the gate's decision with its interval (``gate/publish``,
``gate/difference``, ``gate/low``, ``gate/high``, ...), the watch's, the round's counts and
seconds (``round/...``), the live version of each agent (``live/<agent>``: its version number,
0 for the base model; the MLflow tag ``agl_bridge.live`` names them), the time spent per stage
so far (``time/<stage>``), and per held-out evaluation its score (``eval/<label>/score``);
``finish`` adds the report and the state as artifacts. Each round's training is a child run of
the loop's in MLflow (its per-step metrics, its adapters' metadata), and writes its own
TensorBoard events beside the round's files, so ``tensorboard --logdir WORKDIR`` shows both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agl_bridge.trainer.loop.config import LoopConfig
from agl_bridge.trainer.loop.engine import Loop, LoopCallback
from agl_bridge.trainer.serving.registry import version_number
from agl_bridge.trainer.tracking import Tracker, open_tracker

# what a round's record holds that is no metric: names, paths, text, the round's own number
NOT_METRICS = ("round", "live_before", "live_after", "candidate", "published", "adapters",
               "metrics", "conversion", "consumed", "baselines", "next_task", "reloaded")
ROUND_PREFIX = "round/"  # the record's own numbers; its tables keep their names (gate/...)


def live_numbers(live: dict[str, str]) -> dict[str, float]:
    """Agent -> the number of its live version (``solver@v3`` -> 3; the base model 0)."""
    return {agent: float(version_number(name) or 0) for agent, name in live.items()}


class TrackingCallback(LoopCallback):
    """Reports the loop's rounds to the tools of ``cfg.train.report_to``; does nothing when it
    names none. Close it with ``finish`` (the artifacts) once the loop has returned."""

    def __init__(self, cfg: LoopConfig, extra_params: dict[str, Any] | None = None) -> None:
        train = cfg.train
        self.tracker: Tracker | None = open_tracker(
            train.report_to, run_name=train.run_name or cfg.work.name,
            logging_dir=Path(train.logging_dir) if train.logging_dir else cfg.work / "runs",
            tags={"agl_bridge.workdir": str(cfg.work), "agl_bridge.command": "loop"})
        if self.tracker is not None:
            self.tracker.log_params({**cfg.settings(), **(extra_params or {})})

    def on_evaluate(self, loop: Loop, label: str, out: Path) -> None:
        if self.tracker is None:
            return
        result = loop.data.get(label, {})
        step = result.get("after_rounds", len(loop.data["rounds"]))
        self.tracker.log_metrics({k: v for k, v in result.items() if k != "after_rounds"},
                                 step, prefix=f"eval/{label}/")

    def on_round_end(self, loop: Loop, directory: Path, record: dict[str, Any]) -> None:
        if self.tracker is None:
            return
        r = record["round"]
        own = {k: v for k, v in record.items() if k not in NOT_METRICS}
        tables = {k: v for k, v in own.items() if isinstance(v, dict)}
        self.tracker.log_metrics({k: v for k, v in own.items() if k not in tables}, r,
                                 prefix=ROUND_PREFIX)
        self.tracker.log_metrics(tables, r)
        self.tracker.log_metrics({"published": len(record.get("published") or {})}, r,
                                 prefix=ROUND_PREFIX)
        live = record.get("live_after", loop.data["live"])
        self.tracker.log_metrics(live_numbers(live), r, prefix="live/")
        self.tracker.log_metrics(loop.data.get("seconds", {}), r, prefix="time/")
        self.tracker.set_tags({"agl_bridge.live": ",".join(sorted(set(live.values())))})

    def finish(self, *artifacts: str | Path, status: str = "FINISHED") -> None:
        """The loop returned (or stopped): its report and state as artifacts, then the run
        closed."""
        if self.tracker is None:
            return
        for path in artifacts:
            self.tracker.log_artifact(path)
        self.tracker.close(status)
        self.tracker = None
