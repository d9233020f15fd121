"""Training with ``report_to``: each micro-batch's metrics, the settings, the conversion's
counts and the adapters' metadata, read back with MLflow's client and TensorBoard's reader."""

import json

import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import agl_bridge
from agl_bridge.cli import main
from tests.factories import llm, reward, table


@pytest.fixture
def spans_dir(tmp_path):
    rows = []
    for e, r in enumerate([1.0, 0.0, 1.0, 0.0]):
        for agent in ("solver", "checker"):
            rows.append(llm(f"e{e}", e * 10, agent=agent, prompt=[257, 40 + e, 258],
                            completion=[60 + e, 61, 258]))
        rows.append(reward(f"e{e}", e * 10 + 5, r))
    (tmp_path / "spans").mkdir()
    pq.write_table(table(rows), tmp_path / "spans" / "part.parquet")
    return tmp_path / "spans"


def test_train_from_traces_reports_steps_settings_and_adapters(tiny, spans_dir, tmp_path,
                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)  # MLflow's artifacts: ./mlruns
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = agl_bridge.train_from_traces(
        spans_dir, tiny, policy="per_agent_lora", output_dir=tmp_path / "r1",
        learning_rate=1e-2, per_device_train_batch_size=2, progress=False,
        report_to=["mlflow", "tensorboard"])
    lines = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    solver = [m for m in lines if m["adapter"] == "solver"]
    assert len(solver) == 2  # 4 transitions, 2 a micro-batch

    client = MlflowClient()
    [tracked] = client.search_runs(["0"])
    assert tracked.info.run_name == f"{tmp_path.name}/r1"
    assert tracked.info.status == "FINISHED"
    params = tracked.data.params
    assert params["train.learning_rate"] == "0.01" and params["convert.algorithm"] == "at_grpo"
    assert params["train.report_to"] == '["mlflow", "tensorboard"]'
    history = client.get_metric_history(tracked.info.run_id, "train/solver/loss")
    assert [(h.step, h.value) for h in history] == [(m["micro_batch"], m["loss"])
                                                    for m in solver]
    assert tracked.data.metrics["run/transitions"] == 8.0
    assert tracked.data.metrics["run/steps"] == run.steps
    names = {a.path for a in client.list_artifacts(tracked.info.run_id)}
    assert {"run.json", "metrics.jsonl", "conversion.txt", "adapters"} <= names
    meta = client.download_artifacts(tracked.info.run_id,
                                     "adapters/solver/v0001/agl_bridge_adapter.json",
                                     str(tmp_path / "dl"))
    assert json.loads(open(meta).read())["adapter_name"] == "solver"

    acc = EventAccumulator(str(tmp_path / "r1" / "runs"), size_guidance={"scalars": 0})
    acc.Reload()
    points = acc.Scalars("train/solver/loss")
    assert [e.step for e in points] == [m["micro_batch"] for m in solver]
    assert [e.value for e in points] == pytest.approx([m["loss"] for m in solver])
    assert "train/checker/reward_mean" in acc.Tags()["scalars"]


def test_agl_bridge_train_takes_report_to_as_a_flag(tiny, spans_dir, tmp_path):
    logs = tmp_path / "tb"
    assert main(["train", str(spans_dir), "--base-model", str(tiny), "--output-dir",
                 str(tmp_path / "r2"), "--report-to", "tensorboard", "--logging-dir",
                 str(logs), "--learning-rate", "0.01"]) == 0
    acc = EventAccumulator(str(logs), size_guidance={"scalars": 0})
    acc.Reload()
    assert acc.Scalars("train/policy/loss")
    assert acc.Scalars("run/transitions")[0].value == 8.0
    assert not (tmp_path / "r2" / "runs").exists()  # logging_dir, not the default


def test_a_tool_that_is_not_installed_stops_training_before_it_starts(tiny, spans_dir,
                                                                       tmp_path, monkeypatch):
    from agl_bridge.trainer import tracking

    monkeypatch.setattr(tracking, "installed", lambda tool: False)
    with pytest.raises(ImportError, match=r"agl-bridge\[tracking\]"):
        agl_bridge.train_from_traces(spans_dir, tiny, output_dir=tmp_path / "r3",
                                     report_to=["mlflow"], progress=False)
    assert not (tmp_path / "r3" / "transitions.parquet").exists()
