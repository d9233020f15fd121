"""``trainer/tracking.py``: what ``report_to`` sends reads back with each tool's own reader,
MLflow's client (a sqlite store on disk, and once a real ``mlflow server`` on 127.0.0.1) and
TensorBoard's ``EventAccumulator``; the library imports and runs without either tool."""

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agl_bridge.settings import SettingError, build
from agl_bridge.trainer import tracking
from agl_bridge.trainer.tracking import TrackingUnavailable, open_tracker, tools_for
from agl_bridge.trainer.training.config import GRPOConfig


@pytest.fixture
def store(tmp_path, monkeypatch):
    """MLflow's default kind of store, sqlite on the local disk, as its variable names it."""
    monkeypatch.chdir(tmp_path)  # the store's artifacts: ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "agl-bridge-tests")
    return uri


def events(logdir):
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_report_to_reads_as_transformers_reads_it(monkeypatch):
    assert tools_for(["none"]) == [] and tools_for([]) == []
    assert tools_for(["tensorboard", "mlflow", "tensorboard"]) == ["tensorboard", "mlflow"]
    assert tools_for(["all"]) == ["mlflow", "tensorboard"]
    with pytest.raises(ValueError, match="'none' goes alone"):
        tools_for(["none", "mlflow"])
    monkeypatch.setattr(tracking, "installed", lambda tool: tool != "mlflow")
    assert tools_for(["all"]) == ["tensorboard"]  # every tool installed
    with pytest.raises(TrackingUnavailable, match=r"pip install 'agl-bridge\[tracking\]'"):
        tools_for(["mlflow"])


def test_the_setting_is_declared_once_with_its_choices():
    assert GRPOConfig().report_to == ["none"]
    assert build(GRPOConfig, {"report_to": ["mlflow", "tensorboard"]}).report_to == [
        "mlflow", "tensorboard"]
    with pytest.raises(SettingError, match="report_to"):
        build(GRPOConfig, {"report_to": ["wandb"]}, "test")
    with pytest.raises(SettingError, match="'none' goes alone"):
        build(GRPOConfig, {"report_to": ["none", "tensorboard"]}, "test")


def test_a_run_reads_back_from_mlflow_and_tensorboard(store, tmp_path):
    report = tmp_path / "run.json"
    report.write_text('{"steps": 3}')
    with open_tracker(["mlflow", "tensorboard"], run_name="r1", logging_dir=tmp_path / "tb",
                      tags={"agl_bridge.output_dir": "runs/r1"}) as tracker:
        run_id = tracker.mlflow_run_id
        tracker.log_params({"train": {"learning_rate": 0.01, "lora_target_modules": ["q_proj"]},
                            "seed": 3})
        for step, loss in enumerate([0.5, 0.25, 0.125]):
            tracker.log_metrics({"loss": loss, "grad_norm": float("nan"), "adapter": "solver",
                                 "gate": {"publish": True, "low": -0.1}}, step,
                                prefix="train/")
        tracker.log_artifact(report, "meta")
        tracker.log_text("conversion.txt", "8 transitions")
    client = MlflowClient()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "r1"
    assert client.get_experiment(run.info.experiment_id).name == "agl-bridge-tests"
    assert run.data.params == {"train.learning_rate": "0.01",
                               "train.lora_target_modules": '["q_proj"]', "seed": "3"}
    history = client.get_metric_history(run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(0, 0.5), (1, 0.25), (2, 0.125)]
    assert "train/grad_norm" not in run.data.metrics  # no optimizer step: no curve point
    assert run.data.metrics["train/gate/publish"] == 1.0
    assert run.data.tags["agl_bridge.output_dir"] == "runs/r1"
    assert {a.path for a in client.list_artifacts(run_id)} == {"meta", "conversion.txt"}
    assert client.download_artifacts(run_id, "meta/run.json", str(tmp_path / "dl"))
    acc = events(tmp_path / "tb")
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(0, 0.5), (1, 0.25),
                                                                        (2, 0.125)]
    assert "train/grad_norm" not in acc.Tags()["scalars"]
    text = acc.Tensors("settings")[0].tensor_proto.string_val[0].decode()
    assert "| train.learning_rate | 0.01 |" in text
    assert acc.Tensors("meta/run.json")[0].tensor_proto.string_val[0] == b'{"steps": 3}'


def test_a_run_in_a_run_is_its_child_and_an_error_fails_it(store, tmp_path):
    with open_tracker(["mlflow"], run_name="loop", logging_dir=tmp_path) as parent:
        parent_id = parent.mlflow_run_id
        with pytest.raises(RuntimeError), open_tracker(
                ["mlflow"], run_name="round00/train", logging_dir=tmp_path) as child:
            child_id = child.mlflow_run_id
            raise RuntimeError("training failed")
        parent.log_metrics({"after": 1}, 0)  # the parent is the active run again
    client = MlflowClient()
    child_run, parent_run = client.get_run(child_id), client.get_run(parent_id)
    assert child_run.data.tags["mlflow.parentRunId"] == parent_run.info.run_id
    assert child_run.info.status == "FAILED" and parent_run.info.status == "FINISHED"
    assert parent_run.data.metrics == {"after": 1.0}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_real_mlflow_server_on_loopback(tmp_path, monkeypatch):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "w"),
        start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # 80 s seen on 2 loaded cores
        while True:
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=2).read() == b"OK":
                    break
            except OSError:
                pass
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not start in 300 s"
            time.sleep(1)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        report = tmp_path / "report.html"
        report.write_text("<html>report</html>")
        with open_tracker(["mlflow"], run_name="over-http", logging_dir=tmp_path) as tracker:
            run_id = tracker.mlflow_run_id
            tracker.log_params({"rounds": 2})
            tracker.log_metrics({"gate": {"difference": 0.25}}, 1)
            tracker.log_artifact(report)
        client = MlflowClient(url)
        run = client.get_run(run_id)
        assert run.data.params == {"rounds": "2"} and run.info.status == "FINISHED"
        assert run.data.metrics == {"gate/difference": 0.25}
        assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["report.html"]
        assert list((tmp_path / "artifacts").rglob("report.html"))  # stored by the server
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mlflow", "tensorboard", "datasets", "trl"):
            raise ImportError(f"blocked: {name}")
sys.meta_path.insert(0, Block())
"""


def test_the_library_imports_and_runs_without_the_tools():
    code = BLOCK + """
import importlib.util
importlib.util.find_spec = lambda name, *a: None if name in ("mlflow", "tensorboard") else 1
import agl_bridge.cli, agl_bridge.trainer.training.config, agl_bridge.trainer.tracking as t
import agl_bridge.trainer.conversion.export
assert t.open_tracker(["none"], run_name="x", logging_dir="x") is None
assert t.tools_for(["all"]) == []
try:
    t.open_tracker(["tensorboard"], run_name="x", logging_dir="x")
except t.TrackingUnavailable as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "report_to = 'tensorboard', but tensorboard is not installed: pip install " \
           "'agl-bridge[tracking]'" in out.stdout
