"""Checkpoints a resumed run continues from as if never stopped, with nothing executable in them.

A checkpoint directory ``checkpoint-<step>`` holds ``tensors.safetensors`` (the LoRA weights,
the optimizer's per-parameter state, the pre-update log-probabilities of the transitions seen,
torch's RNG state) and ``state.json`` (counters, optimizer hyper-parameters, metrics so far).
Loading reads tensors with safetensors and the rest with ``json``: a crafted checkpoint can
hold wrong numbers, never code (``torch.load`` of a pickle can run any code; a directory that
holds only the old pickled ``state.pt`` is refused). Written to a temporary directory and
renamed, so a kill leaves the previous checkpoint whole.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch

TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
FORMAT = "agl_bridge.checkpoint.v2"


def save_checkpoint(root: Path, next_micro: int, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, old: dict[int, torch.Tensor],
                    metrics: list[dict[str, Any]], critic: torch.nn.Module | None = None,
                    targets: dict[int, torch.Tensor] | None = None) -> Path:
    """Everything a resumed run needs to continue as if never stopped (atomic directory).
    PPO's too: the ``critic`` (its value heads) and each transition's GAE ``targets`` (the
    values, advantages and returns from before the first update, which a resumed run could
    not compute again: its weights have moved)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {f"lora/{n}": p for n, p in model.named_parameters()
                                        if "lora_" in n}
    if critic is not None:
        tensors.update({f"critic/{n}": p for n, p in critic.named_parameters()})
    opt = optimizer.state_dict()
    _flat_optimizer(opt["state"], tensors)
    tensors.update({f"old/{i}": lp for i, lp in old.items()})
    tensors.update({f"gae/{i}": t for i, t in (targets or {}).items()})
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    tensors["rng"] = torch.get_rng_state()
    state = {"format": FORMAT, "next_micro_batch": next_micro, "step": step,
             "param_groups": opt["param_groups"], "metrics": metrics}
    out = root / f"checkpoint-{step}"
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    try:
        save_file(tensors, str(tmp / TENSORS_FILE))
        (tmp / STATE_FILE).write_text(json.dumps(state))
        _fsync_dir_files(tmp, [tmp / STATE_FILE])
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def remove_unfinished_saves(root: str | os.PathLike[str]) -> list[str]:
    """Remove what saves killed before their rename left in ``root`` (``.tmp-*``: never a
    checkpoint, which only a rename makes). Called as a run starts, before it saves; one run
    per checkpoint directory at a time, as with the checkpoints themselves."""
    gone = []
    for p in Path(root).glob(".tmp-*"):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            gone.append(p.name)
    return gone


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    found = [p for p in Path(root).glob("checkpoint-[0-9]*") if p.name.split("-")[1].isdigit()]
    found.sort(key=lambda p: int(p.name.split("-")[1]))
    return found[-1] if found else None


def resolve_checkpoint(resume: str | os.PathLike[str] | bool,
                       checkpoint_dir: str | os.PathLike[str] | None) -> Path:
    """``resume``: a checkpoint directory, or True for the latest one in ``checkpoint_dir``."""
    path: Path | None
    if isinstance(resume, bool):
        path = latest_checkpoint(checkpoint_dir) if resume and checkpoint_dir else None
    else:
        path = Path(resume)
    where = checkpoint_dir if resume is True else resume
    if path is None or not path.is_dir():
        raise FileNotFoundError(f"no checkpoint to resume from in {where}")
    if not (path / TENSORS_FILE).exists() and not is_sharded(path):
        if (path / "state.pt").exists():
            raise ValueError(f"{path}: a pickled checkpoint (state.pt) is not loaded: unpickling "
                             "can run code from the file. Train again from the last adapter "
                             "version instead.")
        raise FileNotFoundError(f"no checkpoint to resume from in {where}")
    return path


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    old: dict[int, torch.Tensor], critic: torch.nn.Module | None = None,
                    targets: dict[int, torch.Tensor] | None = None
                    ) -> tuple[int, int, list[dict[str, Any]]]:
    """Restore weights, optimizer, logprobs and RNG from ``resolve_checkpoint``'s directory
    (and PPO's critic and GAE targets into ``critic`` and ``targets``); returns (next
    micro-batch, optimizer step, metrics so far)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if is_sharded(path):
        raise ValueError(f"{path}: a sharded (FSDP) checkpoint; resume it under torchrun with "
                         "parallelism='fsdp'")
    try:
        state = json.loads((path / STATE_FILE).read_text())
        tensors = load_file(str(path / TENSORS_FILE))
    except (OSError, ValueError, SafetensorError) as exc:
        raise ValueError(f"{path}: unreadable checkpoint ({exc})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path}: not an agl-bridge checkpoint ({STATE_FILE} has no "
                         f"format {FORMAT!r})")
    params = dict(model.named_parameters())
    lora = {k.removeprefix("lora/"): v for k, v in tensors.items() if k.startswith("lora/")}
    unknown = [n for n in lora if n not in params]
    if unknown:
        raise ValueError(f"{path}: checkpoint does not fit this model/adapters "
                         f"(unknown parameters, e.g. {unknown[0]})")
    for n, v in lora.items():
        if v.shape != params[n].shape:
            raise ValueError(f"{path}: {n} has shape {list(v.shape)} in the checkpoint, "
                             f"{list(params[n].shape)} in the model")
    saved_critic = {k.removeprefix("critic/"): v for k, v in tensors.items()
                    if k.startswith("critic/")}
    _check_critic(path, bool(saved_critic), critic is not None)
    critic_params = dict(critic.named_parameters()) if critic is not None else {}
    if sorted(saved_critic) != sorted(critic_params) or any(
            v.shape != critic_params[n].shape for n, v in saved_critic.items()):
        raise ValueError(f"{path}: its critic does not fit this run's value heads")
    with torch.no_grad():
        for n, v in lora.items():
            params[n].copy_(v)
        for n, v in saved_critic.items():
            critic_params[n].copy_(v)
    if targets is not None:
        targets.update({int(k.removeprefix("gae/")): v for k, v in tensors.items()
                        if k.startswith("gae/")})
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith("optimizer/"):
            _, idx, key = k.split("/", 2)
            opt_state.setdefault(int(idx), {})[key] = v
    optimizer.load_state_dict({"state": opt_state, "param_groups": state["param_groups"]})
    old.update({int(k.removeprefix("old/")): v for k, v in tensors.items()
                if k.startswith("old/")})
    torch.set_rng_state(tensors["rng"])
    return int(state["next_micro_batch"]), int(state["step"]), list(state.get("metrics") or [])


def _check_critic(path: Path, saved: bool, wanted: bool) -> None:
    """A checkpoint with a critic (PPO's value heads) resumes only a run with one."""
    if saved != wanted:
        raise ValueError(f"{path}: a checkpoint of a run " + (
            "with a critic (algorithm ppo)" if saved else "without a critic")
            + " cannot resume one " + ("with" if wanted else "without"))


# ---- sharded (FSDP) checkpoints -------------------------------------------------------------
# The LoRA weights, PPO's value heads and the optimizer state are DTensors sharded over the
# ranks. Each rank writes its own shards with torch's distributed checkpoint (DCP) in its
# safetensors format, whose index lives in the files' JSON headers: DCP's default format keeps
# a pickled ``.metadata`` file, which loading would unpickle. Per rank also the log-probabilities
# of the transitions it saw and its RNG state; rank 0 writes ``state.json`` and, under PPO, the
# GAE targets in its own file (every rank computed the same ones; every rank reads them back
# from there). The checkpoint directory must be one all ranks see (a shared filesystem across
# nodes).

SHARDS_DIR = "shards"


def _rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.safetensors"


def _flat_sharded_state(forward: torch.nn.Module, optimizer: torch.optim.Optimizer
                        ) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """LoRA weights, value heads and optimizer state, flat (``lora/<fqn>``, ``critic/<fqn>``,
    ``optimizer/<fqn>/<key>``), as the ranks' local shards (DTensors); and the optimizer's
    param groups."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from agl_bridge.trainer.training.sharding import all_lora_trainable

    options = StateDictOptions(ignore_frozen_params=True)
    all_lora_trainable(forward)
    model_state: dict[str, Any] = get_model_state_dict(forward, options=options)
    optim_state: dict[str, Any] = dict(get_optimizer_state_dict(forward, optimizer,
                                                                options=options))
    flat: dict[str, torch.Tensor] = {f"lora/{k}": v for k, v in model_state.items()
                                     if "lora_" in k}
    flat.update({f"critic/{k}": v for k, v in model_state.items() if k.startswith("critic.")})
    _flat_optimizer(optim_state["state"], flat)
    return flat, list(optim_state["param_groups"])


def _flat_optimizer(state: dict[Any, dict[str, Any]], flat: dict[str, torch.Tensor]) -> None:
    """Adds ``optimizer/<parameter>/<key>`` entries to ``flat``; refuses state that is not a
    tensor (it could not be saved without pickling)."""
    for idx, entries in state.items():
        for key, value in entries.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"optimizer state {idx}.{key} is not a tensor: {type(value)}")
            flat[f"optimizer/{idx}/{key}"] = value


def save_sharded_checkpoint(root: Path, next_micro: int, step: int, forward: torch.nn.Module,
                            optimizer: torch.optim.Optimizer, old: dict[int, torch.Tensor],
                            metrics: list[dict[str, Any]],
                            targets: dict[int, torch.Tensor] | None = None) -> Path:
    """Every rank calls this (a collective). Written into ``.tmp-checkpoint-<step>`` and
    renamed by rank 0 once all ranks have written: a kill leaves the previous checkpoint whole.
    ``targets``: PPO's GAE targets (``save_checkpoint``), the same on every rank."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    rank, world = dist.get_rank(), dist.get_world_size()
    out = root / f"checkpoint-{step}"
    tmp = root / f".tmp-checkpoint-{step}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / SHARDS_DIR).mkdir(parents=True)
    dist.barrier()
    flat, groups = _flat_sharded_state(forward, optimizer)
    dcp.save(flat, storage_writer=HuggingFaceStorageWriter(str(tmp / SHARDS_DIR),
                                                           save_distributed=True))
    mine = {f"old/{i}": lp.detach().cpu().contiguous().clone() for i, lp in old.items()}
    if rank == 0:
        mine.update({f"gae/{i}": t.detach().cpu().contiguous().clone()
                     for i, t in (targets or {}).items()})
    mine["rng"] = torch.get_rng_state()
    # each rank's own metrics (its micro-batches) in its file's header
    save_file(mine, str(tmp / _rank_file(rank)), metadata={"metrics": json.dumps(metrics)})
    _fsync_dir_files(tmp / SHARDS_DIR, [tmp / _rank_file(rank)] if rank else [])
    dist.barrier()
    if rank == 0:
        state = {"format": FORMAT, "next_micro_batch": next_micro, "step": step,
                 "param_groups": groups, "sharded": True, "world": world,
                 "critic": any(k.startswith("critic/") for k in flat)}
        (tmp / STATE_FILE).write_text(json.dumps(state))
        _fsync_dir_files(tmp, [tmp / STATE_FILE, tmp / _rank_file(0)])
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    dist.barrier()
    return out


def _fsync_dir_files(folder: Path, extra: list[Path]) -> None:
    for f in [*sorted(folder.glob("*.safetensors")), *extra]:
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())


def is_sharded(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / SHARDS_DIR).is_dir()


def load_sharded_checkpoint(path: Path, forward: torch.nn.Module,
                            optimizer: torch.optim.Optimizer, old: dict[int, torch.Tensor],
                            targets: dict[int, torch.Tensor] | None = None
                            ) -> tuple[int, int, list[dict[str, Any]]]:
    """Every rank calls this. The shards are read with DCP (which would also reshard them to
    another world size); the data plan is split by rank, so a run resumes on the world size it
    was saved with, or is refused. PPO's GAE targets go into ``targets``."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors import SafetensorError, safe_open
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        state = json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: unreadable checkpoint ({exc})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or not state.get("sharded"):
        raise ValueError(f"{path}: not a sharded agl-bridge checkpoint ({STATE_FILE})")
    if state.get("world") != world:
        raise ValueError(f"{path}: saved by {state.get('world')} ranks, resumed on {world}; "
                         f"the data plan is split by rank: resume on {state.get('world')}")
    # the template (shapes, placements) has optimizer state for every parameter; the
    # checkpoint only for those trained before it: the others must start with none, as they
    # would have in a run never stopped
    flat, _ = _flat_sharded_state(forward, optimizer)
    _check_critic(path, bool(state.get("critic")), any(k.startswith("critic/") for k in flat))
    shards = str(path / SHARDS_DIR)
    try:
        saved = set(HuggingFaceStorageReader(shards).read_metadata().state_dict_metadata)
        odd = sorted(saved - set(flat)) + sorted(k for k in flat if k.startswith(
            ("lora/", "critic/")) and k not in saved)
        if odd:
            raise ValueError(f"checkpoint does not fit this model/adapters ({odd[0]} is in "
                             "one and not the other)")
        flat = {k: v for k, v in flat.items() if k in saved}
        dcp.load(flat, storage_reader=HuggingFaceStorageReader(shards))
        with safe_open(str(path / _rank_file(rank)), framework="pt") as f:
            mine = {k: f.get_tensor(k) for k in f.keys()}
            metrics = json.loads((f.metadata() or {}).get("metrics", "[]"))
        if targets is not None:
            with safe_open(str(path / _rank_file(0)), framework="pt") as f:
                targets.update({int(k.removeprefix("gae/")): f.get_tensor(k) for k in f.keys()
                                if k.startswith("gae/")})
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as exc:
        raise ValueError(f"{path}: unreadable or mismatched checkpoint shards ({exc})") from None
    options = StateDictOptions(ignore_frozen_params=True, strict=False)
    set_model_state_dict(forward, {k.split("/", 1)[1]: v for k, v in flat.items()
                                   if k.startswith(("lora/", "critic/"))}, options=options)
    optim: dict[str, Any] = {"state": {}, "param_groups": state["param_groups"]}
    for k, v in flat.items():
        if k.startswith("optimizer/"):
            fqn, key = k.removeprefix("optimizer/").rsplit("/", 1)
            optim["state"].setdefault(fqn, {})[key] = v
    set_optimizer_state_dict(forward, optimizer, optim, options=options)
    old.update({int(k.removeprefix("old/")): v for k, v in mine.items() if k.startswith("old/")})
    torch.set_rng_state(mine["rng"])
    if not isinstance(metrics, list):
        raise ValueError(f"{path / _rank_file(rank)}: its metrics are not a list")
    return int(state["next_micro_batch"]), int(state["step"]), metrics
