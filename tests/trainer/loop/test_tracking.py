"""``agl-bridge loop`` with ``[train] report_to``: the loop's rounds (gate decisions with their
intervals, live versions, timings, held-out scores) and each round's training as its child run,
read back with MLflow's client and TensorBoard's reader. A tiny model trains for real; a
scripted server stands in for vLLM and answers wrongly for the first candidate, so the gate
refuses it and publishes the second."""

import json

from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agl_bridge.cli import main
from agl_bridge.trainer.loop.team import write_tasks
from agl_bridge.trainer.loop.tracking import live_numbers
from tests.loop_server import server_for as scripted
from tests.paths import AGENTS


def test_the_loop_reports_rounds_and_each_rounds_training(tmp_path, tiny, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's artifacts: ./mlruns
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    write_tasks(tmp_path / "train.jsonl", [{"task_id": f"t{i}", "number": i} for i in range(8)])
    write_tasks(tmp_path / "eval.jsonl", [{"task_id": f"e{i}", "number": 100 + i}
                                          for i in range(4)])
    work = tmp_path / "loop"
    with scripted(bad={"solver@v1"}) as server:
        config = tmp_path / "loop.json"
        config.write_text(json.dumps({
            "workdir": str(work), "model": str(tiny), "server": server.base_url,
            "agents": ["solver"], "team": f"python {AGENTS / 'loop_team.py'}",
            "tasks": str(tmp_path / "train.jsonl"), "tasks_per_round": 4, "rollouts": 2,
            "eval_tasks": str(tmp_path / "eval.jsonl"), "rounds": 2, "minutes": 30,
            "serve": {"registry": str(tmp_path / "registry")},
            "convert": {"missing_reward": "drop"}, "watch": {"episodes": 4},
            "train": {"learning_rate": 1e-2, "per_device_train_batch_size": 4, "lora_r": 4,
                      "lora_alpha": 8, "policy": "per_agent_lora",
                      "filter_zero_variance_groups": False,  # every answer is right: steps
                      "report_to": ["mlflow", "tensorboard"]}}))
        assert main(["loop", "--config", str(config)]) == 0
    state = json.loads((work / "state.json").read_text())
    gates = [r["gate"] for r in state["rounds"]]
    assert [g["publish"] for g in gates] == [False, True]

    client = MlflowClient()
    runs = client.search_runs(["0"])
    [loop] = [r for r in runs if r.info.run_name == "loop"]
    children = sorted((r for r in runs if r.info.run_name != "loop"),
                      key=lambda r: r.info.run_name)
    assert loop.info.status == "FINISHED"
    assert loop.data.params["rounds"] == "2" and loop.data.params["train.lora_r"] == "4"
    history = {key: [(m.step, m.value) for m in client.get_metric_history(loop.info.run_id, key)]
               for key in ("gate/publish", "gate/low", "gate/high", "gate/difference",
                           "live/solver", "round/seconds", "round/published")}
    assert history["gate/publish"] == [(0, 0.0), (1, 1.0)]
    assert history["gate/difference"] == [(0, gates[0]["difference"]),
                                          (1, gates[1]["difference"])]
    assert [v for _, v in history["gate/low"]] == [g["low"] for g in gates]
    assert [v for _, v in history["gate/high"]] == [g["high"] for g in gates]
    assert history["live/solver"] == [(0, 0.0), (1, 2.0)]  # base, then solver@v2
    assert history["round/published"] == [(0, 0.0), (1, 1.0)]
    assert [s for s, _ in history["round/seconds"]] == [0, 1]
    assert {"time/convert train", "time/rollouts team capture", "time/held-out evaluation",
            "eval/baseline/score", "eval/final/score"} <= set(loop.data.metrics)
    assert loop.data.metrics["eval/final/score"] == state["final"]["score"]
    assert loop.data.tags["agl_bridge.live"] == "solver@v2"
    assert {a.path for a in client.list_artifacts(loop.info.run_id)} == {"summary.txt",
                                                                        "state.json"}

    assert [c.info.run_name for c in children] == ["round00/train", "round01/train"]
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == loop.info.run_id
        assert client.get_metric_history(child.info.run_id, "train/solver/loss")
        assert child.data.params["train.learning_rate"] == "0.01"

    acc = EventAccumulator(str(work / "runs"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("gate/publish")] == [(0, 0.0), (1, 1.0)]
    trained = EventAccumulator(str(work / "round01" / "train" / "runs"))
    trained.Reload()
    assert trained.Scalars("train/solver/loss")


def test_live_versions_as_numbers():
    assert live_numbers({"solver": "solver@v12", "checker": "base"}) == {"solver": 12.0,
                                                                          "checker": 0.0}
