"""``train_from_traces``: traces in, new adapter versions out, in one call.

A run directory holds everything needed to see what happened and to go on from it::

    <output_dir>/transitions.parquet   what was trained on (unless transitions were given)
    <output_dir>/metrics.jsonl         one line per micro-batch (``agl-bridge report`` plots it)
    <output_dir>/adapters/<name>/vN    each trained adapter, PEFT format, with metadata
    <output_dir>/run.json              the settings, the conversion summary, the adapters
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from agl_bridge import settings
from agl_bridge.trainer.conversion import ConversionStats, ConvertConfig, convert
from agl_bridge.trainer.tracking import Tracker, open_tracker
from agl_bridge.trainer.training.config import GRPOConfig, NothingToTrain, check_algorithm


@dataclass
class TrainRun:
    output_dir: Path
    transitions_path: Path
    conversion: ConversionStats | None  # None when transitions were given
    adapters: dict[str, Path]
    steps: int
    metrics_path: Path


def _is_transitions_file(path: Path) -> bool:
    """A transitions file, or a directory holding only transitions files (parts)."""
    if path.is_dir():
        files = [f for f in path.iterdir() if f.name.endswith(".parquet")]
        return bool(files) and all(_is_transitions_file(f) for f in files)
    if not path.is_file() or not path.name.endswith(".parquet"):
        return False
    meta = pq.read_schema(path).metadata or {}
    return meta.get(b"agl_bridge.schema") == b"transitions"


def split_options(options: dict[str, Any], source: str = "train_from_traces()"
                  ) -> tuple[ConvertConfig, GRPOConfig]:
    """Settings by the stage that reads them: conversion (``ConvertConfig``) or training
    (``GRPOConfig``); an unknown name or a wrong value is an error naming it."""
    convert_names = {f.name for f in dataclasses.fields(ConvertConfig)}
    train_names = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(options) - convert_names - train_names)
    if unknown:
        raise settings.SettingError(
            f"{source}: unknown setting(s) {unknown}; conversion: {sorted(convert_names)}; "
            f"training: {sorted(train_names)}")
    rewards = options.get("rewards")
    if rewards is not None and not isinstance(rewards, (str, os.PathLike)):
        options = {**options, "rewards": None, "recipe": rewards}  # a Recipe object
    elif rewards is not None:
        options = {**options, "rewards": os.fspath(rewards)}
    convert_config = settings.build(ConvertConfig, {k: v for k, v in options.items()
                                                     if k in convert_names}, source)
    train_config = settings.build(GRPOConfig, {k: v for k, v in options.items()
                                               if k in train_names}, source)
    try:
        check_algorithm(train_config, convert_config.algorithm)
    except ValueError as exc:
        raise settings.SettingError(f"{source}: {exc}") from None
    return convert_config, train_config


def train_from_traces(
    traces: str | os.PathLike[str] | list,
    base_model: str | os.PathLike[str],
    *,
    output_dir: str | os.PathLike[str] = "agl_bridge_run",
    adapter_name: str = "policy",
    init_adapters: dict[str, str | os.PathLike[str]] | None = None,
    progress: bool = True,
    resume_from_checkpoint: str | os.PathLike[str] | bool | None = None,
    adapters_dir: str | os.PathLike[str] | None = None,
    evaluations_from: str | os.PathLike[str] | None = None,
    **options: Any,
) -> TrainRun:
    """Convert ``traces`` (span Parquet, OTLP/JSON, or a transitions file) and train.

    ``options`` are the settings of the two stages, by name: conversion (``ConvertConfig``:
    ``algorithm`` (``at_grpo`` groups by task, agent and turn and mixes team and local
    rewards; ``lightning_rl`` groups by task; ``ppo`` places each reward at the end of its
    turn and trains a critic beside each policy, with GAE over an agent's turns), ``alpha``,
    ``baseline``, ``missing_reward``, ``rewards`` (a reward recipe: a TOML path or a
    ``Recipe``), ...) and training (``GRPOConfig``: ``objective`` (``grpo``, or ``sft``:
    supervised fine-tuning on the transitions ``sft_select`` picks), ``policy``
    (``shared``, ``per_agent_lora``, ``per_agent_model``), ``learning_rate``, ``beta``,
    ``loss_type``, ``save_steps``, ``lam``, ``vf_coef``, ...);
    each with the default and meaning ``agl-bridge train --help`` shows.
    Checkpoints (``save_steps``) go to ``<output_dir>/checkpoints``; ``resume_from_checkpoint``
    (True: the latest there) continues an interrupted run on the same transitions.
    ``adapters_dir`` (default ``<output_dir>/adapters``) is where versions are numbered: give
    successive runs the same one and their versions count on (v1, v2, ...).
    ``evaluations_from``: a span directory whose evaluation records (feedback, judges) count
    besides ``traces``'. ``report_to`` (a training setting) sends the settings, each
    micro-batch's metrics, the conversion's counts and the adapters' metadata to MLflow and
    TensorBoard (``trainer/tracking.py``).
    """
    from agl_bridge.trainer.training.distributed import world_and_rank

    convert_config, train_config = split_options(options)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tracker = _tracker(train_config, out) if world_and_rank()[1] == 0 else None
    if tracker is None:
        return _train_from_traces(traces, base_model, out, adapter_name, init_adapters,
                                  progress, resume_from_checkpoint, adapters_dir,
                                  evaluations_from, convert_config, train_config, None)
    with tracker:  # an error ends the tracked run as FAILED
        tracker.log_params({"convert": settings.values(convert_config),
                            "train": settings.values(train_config)})
        try:
            return _train_from_traces(traces, base_model, out, adapter_name, init_adapters,
                                      progress, resume_from_checkpoint, adapters_dir,
                                      evaluations_from, convert_config, train_config, tracker)
        except NothingToTrain as exc:  # a round with nothing to learn from: no failure
            tracker.set_tags({"agl_bridge.nothing_to_train": str(exc).splitlines()[0]})
            tracker.close()
            raise


def _tracker(config: GRPOConfig, out: Path) -> Tracker | None:
    """The run ``report_to`` asks for: named after the output directory (``round03/train``
    in the loop), TensorBoard's events in ``logging_dir`` or ``OUTPUT_DIR/runs``."""
    name = config.run_name or (f"{out.parent.name}/{out.name}" if out.parent.name else out.name)
    return open_tracker(config.report_to, run_name=name,
                        logging_dir=config.logging_dir or out / "runs",
                        tags={"agl_bridge.output_dir": str(out.resolve())})


def _train_from_traces(traces, base_model, out: Path, adapter_name: str, init_adapters,
                       progress: bool, resume_from_checkpoint, adapters_dir, evaluations_from,
                       convert_config: ConvertConfig, train_config: GRPOConfig,
                       tracker: Tracker | None) -> TrainRun:
    from agl_bridge.trainer.training.distributed import world_and_rank
    from agl_bridge.trainer.training.loop import train_policy

    single = Path(traces) if isinstance(traces, (str, os.PathLike)) else None
    stats = None
    if single is not None and _is_transitions_file(single):
        transitions = single
    elif resume_from_checkpoint and (out / "transitions.parquet").exists():
        transitions = out / "transitions.parquet"  # the data the interrupted run trained on
    else:
        # under torchrun, rank 0 converts (into output_dir, which every rank must see) while
        # the others wait for its file
        world, rank = world_and_rank()
        transitions = out / "transitions.parquet"
        if rank == 0:
            stats = convert(traces, transitions, convert_config,
                            evaluations_from=evaluations_from)
        if world > 1:
            _barrier()
        if stats is not None and stats.transitions == 0:
            raise NothingToTrain(f"no transitions from {traces}:\n"
                                 f"{stats.summary(convert_config.algorithm)}")
        if not transitions.exists():
            raise FileNotFoundError(f"{transitions}: rank 0's conversion is not there; under "
                                    "torchrun on several hosts, output_dir must be shared")
    metrics_path = out / "metrics.jsonl"
    t0 = time.time()
    adapters_root = Path(adapters_dir) if adapters_dir is not None else out / "adapters"
    result = train_policy(transitions, base_model, adapters_root, adapter_name=adapter_name,
                          config=train_config, init_adapters=init_adapters,
                          metrics_path=metrics_path, progress=progress,
                          checkpoint_dir=out / "checkpoints",
                          resume_from_checkpoint=resume_from_checkpoint, tracker=tracker,
                          algorithm=convert_config.algorithm, gamma=convert_config.gamma)
    run = TrainRun(out, transitions, stats, result.adapters, result.steps, metrics_path)
    if world_and_rank()[1] != 0:
        return run
    (out / "run.json").write_text(json.dumps({
        "traces": [str(t) for t in traces] if isinstance(traces, list) else str(traces),
        "base_model": str(base_model),
        "settings": {"convert": settings.values(convert_config),
                     "train": settings.values(train_config)},
        "conversion": stats.summary(convert_config.algorithm) if stats else None,
        "adapters": {k: str(v) for k, v in result.adapters.items()}, "steps": result.steps,
        "seconds": time.time() - t0,
    }, indent=2, default=str))
    if tracker is not None:
        _track_outputs(tracker, run, stats, time.time() - t0, convert_config.algorithm)
    return run


def _track_outputs(tracker: Tracker, run: TrainRun, stats: ConversionStats | None,
                   seconds: float, algorithm: str | None = None) -> None:
    """What a run leaves, for the tracker: the conversion's counts (under ``ppo`` not its
    groups: the critic's advantages train), the time, the adapters' metadata, ``run.json``
    and ``metrics.jsonl``."""
    from agl_bridge.trainer.adapters import METADATA_FILE

    summary: dict[str, Any] = {"steps": run.steps, "seconds": seconds}
    if stats is not None:
        summary.update(transitions=stats.transitions, episodes=stats.episodes,
                       llm_spans=stats.llm_spans, skipped=sum(stats.skipped.values()))
        if algorithm != "ppo":
            summary.update(groups=stats.groups, zero_variance_groups=stats.zero_variance_groups)
        tracker.log_text("conversion.txt", stats.summary(algorithm))
    tracker.log_metrics(summary, run.steps, prefix="run/")
    for name, directory in sorted(run.adapters.items()):
        tracker.log_artifact(directory / METADATA_FILE, f"adapters/{name}/{directory.name}")
    tracker.set_tags({"agl_bridge.adapters": json.dumps(
        {k: str(v) for k, v in sorted(run.adapters.items())})})
    tracker.log_artifact(run.output_dir / "run.json")
    tracker.log_artifact(run.metrics_path)


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()
