"""Prometheus metrics of ``agl-bridge loop`` (``trainer/loop/metrics.py``): a real loop on the
tiny model, with a scripted server in vLLM's place, scraped over HTTP as Prometheus would."""

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agl_bridge.otel.metrics import serve
from agl_bridge.settings import build
from agl_bridge.trainer.loop.config import LoopConfig
from agl_bridge.trainer.loop.engine import Loop
from agl_bridge.trainer.loop.metrics import MetricsCallback
from agl_bridge.trainer.loop.team import write_tasks
from tests.feedback_runs import clean_env
from tests.loop_server import server_for as server_answering_wrongly_as
from tests.otlp_helpers import free_port
from tests.paths import AGENTS

TEAM = f"python {AGENTS / 'loop_team.py'}"
EXE = Path(sys.executable).with_name("agl-bridge")


def settings(tmp_path, tiny, server):
    """Two rounds, the gate off: v1 goes live, answers wrongly, is rolled back, v2 goes live."""
    write_tasks(tmp_path / "train.jsonl", [{"task_id": f"t{i}", "number": i} for i in range(12)])
    return dict(workdir=str(tmp_path / "loop"), model=str(tiny), server=server.base_url,
                serve={"registry": str(tmp_path / "registry")}, agents=["solver"], team=TEAM,
                tasks=str(tmp_path / "train.jsonl"), tasks_per_round=4, rollouts=2, rounds=2,
                minutes=30, gate={"rule": "off"}, watch={"episodes": 4},
                train={"learning_rate": 1e-2, "per_device_train_batch_size": 4, "lora_r": 4,
                       "lora_alpha": 8, "policy": "per_agent_lora"},
                convert={"missing_reward": "drop"})


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_loop_serves_its_rounds_gate_decisions_rollbacks_and_live_versions(tmp_path, tiny):
    metrics = MetricsCallback()
    port = free_port()
    server = serve(metrics.registry, "127.0.0.1", port)
    try:
        with server_answering_wrongly_as({"solver@v1"}) as team_server:
            data = Loop(build(LoopConfig, settings(tmp_path, tiny, team_server), "test"),
                        callbacks=[metrics]).run()
        got = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
    assert data["rounds"][1]["rolled_back"] is True  # what the metrics must show
    assert got[("agl_bridge_loop_rounds_total", ())] == 2
    assert got[("agl_bridge_loop_round", ())] == 1
    assert got[("agl_bridge_loop_round_seconds", ())] > 0
    assert got[("agl_bridge_loop_gate_decisions_total", (("decision", "publish"),))] == 2
    assert got[("agl_bridge_loop_gate_decisions_total", (("decision", "refuse"),))] == 0
    assert got[("agl_bridge_loop_publishes_total", ())] == 2
    assert got[("agl_bridge_loop_rollbacks_total", ())] == 1
    assert got[("agl_bridge_loop_trainings_total", (("outcome", "trained"),))] == 2
    live = {labels: v for (name, labels), v in got.items()
            if name == "agl_bridge_loop_live_version"}
    assert live == {(("alias", "solver"), ("version", "solver@v2")): 1}  # v1 is gone


def test_the_loop_command_serves_metrics_while_it_runs(tmp_path, tiny):
    port = free_port()
    with server_answering_wrongly_as({"solver@v1"}) as team_server:
        config = tmp_path / "loop.json"
        config.write_text(json.dumps(settings(tmp_path, tiny, team_server)))
        proc = subprocess.Popen([str(EXE), "loop", "--config", str(config), "--metrics-port",
                                 str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=clean_env())
        seen = []
        deadline = time.monotonic() + 300
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    seen.append(scrape(f"http://127.0.0.1:{port}/metrics"))
                except (urllib.error.URLError, ConnectionError):
                    pass  # not serving yet, or already stopped
                time.sleep(0.2)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert f"metrics at http://127.0.0.1:{port}/metrics" in stdout
    rounds = [s[("agl_bridge_loop_rounds_total", ())] for s in seen]
    assert rounds and rounds[0] == 0 and max(rounds) >= 1 and rounds == sorted(rounds)
    after_first = next(s for s in seen if s[("agl_bridge_loop_rounds_total", ())] == 1)
    assert after_first[("agl_bridge_loop_live_version",
                        (("alias", "solver"), ("version", "solver@v1")))] == 1
