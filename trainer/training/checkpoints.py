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
                    metrics: list[dict[str, Any]]) -> Path:
    """Everything a resumed run needs to continue as if never stopped (atomic directory)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for n, p in model.named_parameters():
        if "lora_" in n:
            tensors[f"lora/{n}"] = p.detach().cpu().contiguous().clone()
    opt = optimizer.state_dict()
    for idx, state in opt["state"].items():
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"optimizer state {idx}.{key} is not a tensor: {type(value)}")
            tensors[f"optimizer/{idx}/{key}"] = value.detach().cpu().contiguous().clone()
    for i, lp in old.items():
        tensors[f"old/{i}"] = lp.detach().cpu().contiguous().clone()
    tensors["rng"] = torch.get_rng_state()
    state = {"format": FORMAT, "next_micro_batch": next_micro, "step": step,
             "param_groups": opt["param_groups"], "metrics": metrics}
    out = root / f"checkpoint-{step}"
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    try:
        save_file(tensors, str(tmp / TENSORS_FILE))
        (tmp / STATE_FILE).write_text(json.dumps(state))
        for f in (TENSORS_FILE, STATE_FILE):
            with open(tmp / f, "rb") as fh:
                os.fsync(fh.fileno())
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    found = [p for p in Path(root).glob("checkpoint-[0-9]*") if p.name.split("-")[1].isdigit()]
    found.sort(key=lambda p: int(p.name.split("-")[1]))
    return found[-1] if found else None


def load_checkpoint(resume: str | os.PathLike[str] | bool, checkpoint_dir: str | os.PathLike[str]
                    | None, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    old: dict[int, torch.Tensor]) -> tuple[int, int, list[dict[str, Any]]]:
    """Restore weights, optimizer, logprobs and RNG; returns (next micro-batch, optimizer step,
    metrics so far). ``resume``: a checkpoint directory, or True for the latest one in
    ``checkpoint_dir``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path: Path | None
    if isinstance(resume, bool):
        path = latest_checkpoint(checkpoint_dir) if resume and checkpoint_dir else None
    else:
        path = Path(resume)
    where = checkpoint_dir if resume is True else resume
    if path is None or not path.is_dir():
        raise FileNotFoundError(f"no checkpoint to resume from in {where}")
    if not (path / TENSORS_FILE).exists():
        if (path / "state.pt").exists():
            raise ValueError(f"{path}: a pickled checkpoint (state.pt) is not loaded: unpickling "
                             "can run code from the file. Train again from the last adapter "
                             "version instead.")
        raise FileNotFoundError(f"no checkpoint to resume from in {where}")
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
    with torch.no_grad():
        for n, v in lora.items():
            params[n].copy_(v)
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
