"""Experiment tracking: a run's settings, metrics and artifacts sent to the tools its users
already have, MLflow and TensorBoard, chosen with ``report_to`` as TRL and transformers name it.

``report_to`` is a list: ``none`` (the library's default), ``all`` (every tool installed), or
any of ``mlflow`` and ``tensorboard``. A tool asked for by name that is not installed is an
error naming the extra that installs it (``agl-bridge[tracking]``), raised before anything
runs; nothing here imports either tool until a run asks for it, so the library imports without
them.

Each tool is configured as its users configure it: MLflow from its own variables
(``MLFLOW_TRACKING_URI``, default ``sqlite:///mlflow.db`` in the working directory;
``MLFLOW_EXPERIMENT_NAME``), and a run started while another MLflow run is active in the process
(a round's training inside ``agl-bridge loop``) is that run's child; TensorBoard as event files
in a logging directory (``tensorboard --logdir``), written with tensorboard's own event writer
(no torch). Values that are not finite numbers are left out of the metrics (a micro-batch that
took no optimizer step has no gradient norm).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from agl_bridge.settings import paths_values

ReportTo = Literal["none", "all", "mlflow", "tensorboard"]
TOOLS: tuple[str, ...] = ("mlflow", "tensorboard")
EXTRA = "tracking"  # the extra of pyproject.toml that installs them
PARAM_VALUE_MAX = 6000  # MLflow's limit on a parameter's value


class TrackingUnavailable(ImportError):
    """``report_to`` names a tool that is not installed."""


def installed(tool: str) -> bool:
    return importlib.util.find_spec(tool) is not None


def tools_for(report_to: Iterable[str]) -> list[str]:
    """The tools ``report_to`` asks for: ``none`` alone means none, ``all`` every installed
    one (as transformers reads it); a named tool that is not installed raises
    ``TrackingUnavailable``."""
    wanted = list(report_to)
    if not wanted or "none" in wanted:
        if len(wanted) > 1:
            raise ValueError(f"report_to: 'none' goes alone, got {wanted}")
        return []
    if "all" in wanted:
        return [t for t in TOOLS if installed(t)]
    for tool in wanted:
        if tool not in TOOLS:
            raise ValueError(f"report_to: unknown tool {tool!r}; known: none, all, "
                             + ", ".join(TOOLS))
        if not installed(tool):
            raise TrackingUnavailable(
                f"report_to = {tool!r}, but {tool} is not installed: pip install "
                f"'agl-bridge[{EXTRA}]'")
    return list(dict.fromkeys(wanted))


def numbers(values: Mapping[str, Any], prefix: str = "", sep: str = "/") -> dict[str, float]:
    """The finite numbers (and booleans, as 0 or 1) of nested values as metrics: text, lists
    and non-finite numbers are left out."""
    out: dict[str, float] = {}
    for key, value in paths_values(values, prefix, sep).items():
        if isinstance(value, bool):
            out[metric_name(key)] = float(value)
        elif isinstance(value, (int, float)) and math.isfinite(value):
            out[metric_name(key)] = float(value)
    return out


def metric_name(key: str) -> str:
    """A name every tool takes (MLflow's: letters, digits, ``_-. :/``): other characters are
    dropped (``time/convert + train`` -> ``time/convert train``)."""
    return " ".join(re.sub(r"[^\w\-. :/]+", " ", key).split())


class _MLflow:
    """One MLflow run, the child of the process's active run if there is one."""

    def __init__(self, run_name: str, tags: Mapping[str, str]) -> None:
        import mlflow

        self.mlflow = mlflow
        self.client = mlflow.MlflowClient()
        parent = mlflow.active_run()
        self.run = mlflow.start_run(run_name=run_name, nested=parent is not None,
                                    tags=dict(tags))
        self.run_id = self.run.info.run_id

    def params(self, values: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, _param_text(v)) for k, v in values.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit for parameters
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def metrics(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i:i + 1000])

    def tags(self, values: Mapping[str, str]) -> None:
        for key, value in values.items():
            self.client.set_tag(self.run_id, key, value)

    def text(self, name: str, text: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def artifact(self, path: Path, folder: str | None) -> None:
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), folder)
        else:
            self.client.log_artifact(self.run_id, str(path), folder)

    def close(self, status: str) -> None:
        active = self.mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            self.mlflow.end_run(status)
        else:  # not on top of the active-run stack: end it by its id
            self.client.set_terminated(self.run_id, status)


class _TensorBoard:
    """Event files in one directory, as ``torch.utils.tensorboard`` writes them."""

    def __init__(self, logdir: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        logdir.mkdir(parents=True, exist_ok=True)
        self.logdir = logdir
        self.writer = EventFileWriter(str(logdir))

    def _event(self, value: Any, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.writer.add_event(Event(wall_time=time.time(), step=step,
                                    summary=Summary(value=[value])))

    def params(self, values: Mapping[str, Any]) -> None:
        rows = "\n".join(f"| {k} | {_param_text(v)} |" for k, v in values.items())
        self.text("settings", "| setting | value |\n| --- | --- |\n" + rows)

    def metrics(self, values: Mapping[str, float], step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        for key, value in values.items():
            self._event(Summary.Value(tag=key, simple_value=value), step)
        self.writer.flush()

    def tags(self, values: Mapping[str, str]) -> None:
        for key, value in values.items():
            self.text(key, value)

    def text(self, name: str, text: str, step: int = 0) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(dtype=7, string_val=[text.encode()],  # 7: DT_STRING
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        self._event(Summary.Value(tag=name, metadata=meta, tensor=tensor), step)
        self.writer.flush()

    def artifact(self, path: Path, folder: str | None) -> None:
        """TensorBoard keeps no files: a small JSON or text file is shown as text."""
        if path.is_file() and path.suffix in (".json", ".txt") and path.stat().st_size < 1 << 16:
            self.text(f"{folder}/{path.name}" if folder else path.name, path.read_text())

    def close(self, status: str) -> None:
        self.writer.close()


class Tracker:
    """A run reported to zero or more tools; a context manager that closes it (an exception
    marks the MLflow run FAILED)."""

    def __init__(self, backends: list[Any]) -> None:
        self.backends = backends

    @property
    def mlflow_run_id(self) -> str | None:
        return next((b.run_id for b in self.backends if isinstance(b, _MLflow)), None)

    @property
    def logdir(self) -> Path | None:
        return next((b.logdir for b in self.backends if isinstance(b, _TensorBoard)), None)

    def log_params(self, settings: Mapping[str, Any]) -> None:
        """Settings, nested tables as dotted names (``train.learning_rate``)."""
        values = paths_values(settings)
        for b in self.backends:
            b.params(values)

    def log_metrics(self, values: Mapping[str, Any], step: int, prefix: str = "") -> None:
        """The finite numbers of ``values`` (nested: ``gate/low``) at ``step``."""
        metrics = numbers(values, prefix)
        if metrics:
            for b in self.backends:
                b.metrics(metrics, step)

    def set_tags(self, values: Mapping[str, str]) -> None:
        for b in self.backends:
            b.tags(values)

    def log_text(self, name: str, text: str) -> None:
        for b in self.backends:
            b.text(name, text)

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        p = Path(path)
        if p.exists():
            for b in self.backends:
                b.artifact(p, folder)

    def close(self, status: str = "FINISHED") -> None:
        while self.backends:
            self.backends.pop().close(status)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close("FINISHED" if kind is None else
                   "KILLED" if issubclass(kind, (KeyboardInterrupt, SystemExit)) else "FAILED")


def open_tracker(report_to: Iterable[str], *, run_name: str, logging_dir: str | Path,
                 tags: Mapping[str, str] | None = None) -> Tracker | None:
    """A run on the tools ``report_to`` asks for, or None when it asks for none.
    ``logging_dir``: TensorBoard's event files."""
    tools = tools_for(report_to)
    if not tools:
        return None
    backends: list[Any] = []
    try:
        for tool in tools:
            backends.append(_MLflow(run_name, tags or {}) if tool == "mlflow"
                            else _TensorBoard(Path(logging_dir)))
    except BaseException:
        Tracker(backends).close("FAILED")
        raise
    return Tracker(backends)


def _param_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= PARAM_VALUE_MAX else text[:PARAM_VALUE_MAX - 3] + "..."
