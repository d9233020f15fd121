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
from typing import Any, Literal

import pyarrow.parquet as pq

from agl_bridge.trainer.conversion import ConversionStats, ConvertConfig, convert
from agl_bridge.trainer.rewards.credit import Algorithm
from agl_bridge.trainer.rewards.recipes import Recipe, load_recipe
from agl_bridge.trainer.training.config import POLICIES, TRAIN_ALGORITHMS, Policy, one_of


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


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Options by owner: converter (ConvertConfig) or trainer (GRPOConfig); unknown names are
    an error that lists the known ones."""
    from agl_bridge.trainer.training.config import GRPOConfig

    convert_names = {f.name for f in dataclasses.fields(ConvertConfig)}
    train_names = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(options) - convert_names - train_names)
    if unknown:
        raise TypeError(f"unknown option(s) {unknown}; converter options: "
                        f"{sorted(convert_names)}; trainer options: {sorted(train_names)}")
    return ({k: v for k, v in options.items() if k in convert_names},
            {k: v for k, v in options.items() if k in train_names})


def train_from_traces(
    traces: str | os.PathLike[str] | list,
    base_model: str | os.PathLike[str],
    *,
    algorithm: Algorithm | Literal["sft"] = "at_grpo",
    policy: Policy = "shared",
    output_dir: str | os.PathLike[str] = "agl_bridge_run",
    adapter_name: str = "policy",
    init_adapters: dict[str, str | os.PathLike[str]] | None = None,
    progress: bool = True,
    resume_from_checkpoint: str | os.PathLike[str] | bool | None = None,
    adapters_dir: str | os.PathLike[str] | None = None,
    rewards: str | os.PathLike[str] | Recipe | None = None,
    evaluations_from: str | os.PathLike[str] | None = None,
    **options: Any,
) -> TrainRun:
    """Convert ``traces`` (span Parquet, OTLP/JSON, or a transitions file) and train.

    ``algorithm``: ``at_grpo`` (groups by task, agent and turn; team and local rewards mixed),
    ``lightning_rl`` (identical assignment, groups by task), or ``sft``: supervised
    fine-tuning on the completions of the transitions ``sft_select`` picks (the best of each
    AT-GRPO group, or every one with reward at least ``sft_min_reward``), converted as
    ``at_grpo`` converts. ``policy``: ``shared``,
    ``per_agent_lora`` or ``per_agent_model``. Other keyword options go to the converter
    (``ConvertConfig``: alpha, gamma, advantage_unit, missing_reward, ...) or the trainer
    (``GRPOConfig``: learning_rate, beta, loss_type, epsilon, save_steps, ...), by name.
    Checkpoints (``save_steps``) go to ``<output_dir>/checkpoints``; ``resume_from_checkpoint``
    (True: the latest there) continues an interrupted run on the same transitions.
    ``adapters_dir`` (default ``<output_dir>/adapters``) is where versions are numbered: give
    successive runs the same one and their versions count on (v1, v2, ...). ``rewards``: a
    reward recipe (a TOML path or a ``Recipe``) applied at conversion; ``evaluations_from``: a
    span directory whose evaluation records (feedback, judges) count besides ``traces``'.
    """
    from agl_bridge.trainer.training.config import GRPOConfig
    from agl_bridge.trainer.training.distributed import world_and_rank
    from agl_bridge.trainer.training.loop import train_policy

    if algorithm not in TRAIN_ALGORITHMS:
        raise ValueError(f"algorithm must be {one_of(TRAIN_ALGORITHMS)}, got {algorithm!r}")
    credit: Algorithm = "at_grpo" if algorithm == "sft" else algorithm
    if policy not in POLICIES:
        raise ValueError(f"policy must be {one_of(POLICIES)}, got {policy!r}")
    convert_options, train_options = split_options(options)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
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
            recipe = (load_recipe(rewards) if isinstance(rewards, (str, os.PathLike))
                      else rewards)
            stats = convert(traces, transitions,
                            ConvertConfig(algorithm=credit, recipe=recipe, **convert_options),
                            evaluations_from=evaluations_from)
        if world > 1:
            _barrier()
        if stats is not None and stats.transitions == 0:
            raise ValueError(f"no transitions from {traces}:\n{stats.summary()}")
        if not transitions.exists():
            raise FileNotFoundError(f"{transitions}: rank 0's conversion is not there; under "
                                    "torchrun on several hosts, output_dir must be shared")
    metrics_path = out / "metrics.jsonl"
    t0 = time.time()
    adapters_root = Path(adapters_dir) if adapters_dir is not None else out / "adapters"
    result = train_policy(transitions, base_model, adapters_root, policy=policy,
                          adapter_name=adapter_name, config=GRPOConfig(**train_options),
                          init_adapters=init_adapters, metrics_path=metrics_path,
                          progress=progress, checkpoint_dir=out / "checkpoints",
                          resume_from_checkpoint=resume_from_checkpoint,
                          objective="sft" if algorithm == "sft" else "grpo")
    run = TrainRun(out, transitions, stats, result.adapters, result.steps, metrics_path)
    if world_and_rank()[1] != 0:
        return run
    (out / "run.json").write_text(json.dumps({
        "traces": [str(t) for t in traces] if isinstance(traces, list) else str(traces),
        "base_model": str(base_model), "algorithm": algorithm, "policy": policy,
        "options": options, "conversion": stats.summary() if stats else None,
        "adapters": {k: str(v) for k, v in result.adapters.items()}, "steps": result.steps,
        "seconds": time.time() - t0,
    }, indent=2, default=str))
    return run


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()
