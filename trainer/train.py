"""Trainer v0: one GRPO round on a LoRA adapter from transitions Parquet.

Each call writes a new adapter version in standard PEFT format to its own directory
(``<adapters_root>/<name>/v0001``, ``v0002``, ...), so serving never reloads a directory in place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from agl_bridge._version import __version__
from agl_bridge.parquet_io import read_checked
from agl_bridge.schema import REQUIRED_TRANSITION_COLUMNS
from agl_bridge.trainer.losses import group_advantages, grpo_clip_loss, token_logprobs

logger = logging.getLogger(__name__)

METADATA_FILE = "agl_bridge_adapter.json"


@dataclass
class GRPOConfig:
    """Names follow TRL's GRPOConfig where the concept is the same."""

    learning_rate: float = 1e-4
    num_train_epochs: int = 1  # passes over the transitions
    per_device_train_batch_size: int = 8
    epsilon: float = 0.2  # clip range low
    epsilon_high: float | None = None  # clip range high (defaults to epsilon)
    max_grad_norm: float = 1.0
    seed: int = 0
    lora_r: int = 8
    lora_alpha: int = 16
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    scale_rewards_eps: float = 1e-4


@dataclass
class TrainResult:
    adapter_dir: Path
    version: int
    steps: int
    metrics: list[dict[str, float]]


def base_model_fingerprint(model_dir: str | os.PathLike[str]) -> str:
    """sha256 over config.json and the names and sizes of the weight files: cheap, and enough to
    refuse an adapter trained on another base."""
    d = Path(model_dir)
    h = hashlib.sha256((d / "config.json").read_bytes())
    for f in sorted(d.glob("*.safetensors")) + sorted(d.glob("*.bin")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()


def next_version_dir(adapters_root: str | os.PathLike[str], name: str) -> tuple[int, Path]:
    root = Path(adapters_root) / name
    versions = [int(p.name[1:]) for p in root.glob("v[0-9]*") if p.name[1:].isdigit()]
    version = max(versions, default=0) + 1
    return version, root / f"v{version:04d}"


def latest_adapter(adapters_root: str | os.PathLike[str], name: str) -> Path | None:
    root = Path(adapters_root) / name
    found = sorted((p for p in root.glob("v[0-9]*") if (p / METADATA_FILE).exists()),
                   key=lambda p: int(p.name[1:]))
    return found[-1] if found else None


def read_transitions(path: str | os.PathLike[str]) -> pa.Table:
    return read_checked(Path(path), REQUIRED_TRANSITION_COLUMNS)


def _batches(n: int, size: int, rng: random.Random) -> list[list[int]]:
    order = list(range(n))
    rng.shuffle(order)
    return [order[i:i + size] for i in range(0, n, size)]


def _collate(rows: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded prompt+completion; ``targets`` and ``loss_mask`` cover completion tokens."""
    seqs = [r["prompt_ids"] + r["completion_ids"] for r in rows]
    width = max(len(s) for s in seqs)
    comp_width = max(len(r["completion_ids"]) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    # positions whose logits predict completion token j: prompt_len - 1 + j
    positions = torch.zeros((len(rows), comp_width), dtype=torch.long)
    targets = torch.full((len(rows), comp_width), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(rows), comp_width), dtype=torch.float32)
    for i, (r, s) in enumerate(zip(rows, seqs)):
        p, c = len(r["prompt_ids"]), len(r["completion_ids"])
        input_ids[i, : len(s)] = torch.tensor(s)
        attention[i, : len(s)] = 1
        positions[i, :c] = torch.arange(p - 1, p - 1 + c)
        targets[i, :c] = torch.tensor(r["completion_ids"])
        loss_mask[i, :c] = torch.tensor(r["completion_mask"], dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention, "positions": positions,
            "targets": targets, "loss_mask": loss_mask}


def completion_logprobs(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Log-probabilities of the completion tokens; the LM head runs on completion positions only."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(lm, lm.base_model_prefix)  # the decoder stack without its LM head
    head = model.get_output_embeddings()
    hidden = body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    idx = batch["positions"].unsqueeze(-1).expand(-1, -1, hidden.size(-1))
    logits = head(hidden.gather(1, idx))
    return token_logprobs(logits, batch["targets"])


def train_grpo(
    transitions: str | os.PathLike[str] | pa.Table,
    base_model: str | os.PathLike[str],
    adapters_root: str | os.PathLike[str],
    *,
    adapter_name: str = "policy",
    config: GRPOConfig | None = None,
    init_adapter: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> TrainResult:
    """One GRPO round: advantages per group (task), clipped loss over completion tokens, save.

    ``init_adapter`` continues from an earlier version; otherwise a fresh LoRA is created.
    """
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    cfg = config or GRPOConfig()
    table = transitions if isinstance(transitions, pa.Table) else read_transitions(transitions)
    if table.num_rows == 0:
        raise ValueError("no transitions to train on (see the converter's skip counts)")
    columns = ["prompt_ids", "completion_ids", "completion_mask", "reward", "group_id",
               "behaviour_logprobs"]
    if "advantage" in table.column_names:
        columns.append("advantage")
    rows = table.select(columns).to_pylist()
    for i, r in enumerate(rows):
        if not math.isfinite(r["reward"]):
            raise ValueError(f"transition {i}: reward is {r['reward']}; refusing to train on it")
    if rows and all(r.get("advantage") is not None for r in rows):
        advantages = [r["advantage"] for r in rows]  # as the converter was configured
    else:
        advantages = group_advantages([r["reward"] for r in rows], [r["group_id"] for r in rows],
                                      eps=cfg.scale_rewards_eps)

    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    if init_adapter is not None:
        model = PeftModel.from_pretrained(model, init_adapter, is_trainable=True)
    else:
        model = get_peft_model(model, LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
            target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM"))
    model.train()
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate)
    eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high

    plan = [b for _ in range(cfg.num_train_epochs)
            for b in _batches(len(rows), cfg.per_device_train_batch_size, rng)]
    bar = _progress(len(plan), progress)
    old: dict[int, torch.Tensor] = {}  # logprobs of each transition under the pre-update policy
    metrics: list[dict[str, float]] = []
    for step, idx in enumerate(plan):
        t0 = time.perf_counter()
        batch = _collate([rows[i] for i in idx], pad_id)
        logp = completion_logprobs(model, batch)
        for j, i in enumerate(idx):  # first visit: on-policy, ratio 1; later epochs clip
            old.setdefault(i, logp[j].detach().clone())
        old_logp = torch.stack([old[i] for i in idx])
        adv = torch.tensor([advantages[i] for i in idx])
        loss, stats = grpo_clip_loss(logp, old_logp, adv, batch["loss_mask"],
                                     epsilon_low=cfg.epsilon, epsilon_high=eps_high)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {step} (transitions {idx})")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
        n_tokens = float(batch["loss_mask"].sum())
        m = {"step": step, "loss": float(loss.detach()), "grad_norm": float(grad_norm),
             "reward_mean": sum(rows[i]["reward"] for i in idx) / len(idx),
             "advantage_abs_mean": float(adv.abs().mean()), "tokens": n_tokens,
             "tokens_per_s": n_tokens / (time.perf_counter() - t0), **stats}
        mismatch = _behaviour_gap(rows, idx, logp, batch["loss_mask"])
        if mismatch is not None:
            m["behaviour_logprob_abs_diff"] = mismatch
        metrics.append(m)
        bar.update(1)
        bar.set_postfix(loss=f"{m['loss']:.4f}")
    bar.close()

    version, out_dir = next_version_dir(adapters_root, adapter_name)
    tmp = out_dir.with_name(f".tmp-{uuid.uuid4().hex}-{out_dir.name}")
    model.save_pretrained(tmp)
    meta = {
        "agl_bridge_version": __version__, "adapter_name": adapter_name, "version": version,
        "base_model": str(Path(base_model).resolve()),
        "base_model_fingerprint": base_model_fingerprint(base_model),
        "init_adapter": str(init_adapter) if init_adapter else None,
        "transitions": len(rows), "steps": len(plan), "config": asdict(cfg),
        "final_metrics": metrics[-1], "created_unix": time.time(),
    }
    (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2))
    try:
        tmp.rename(out_dir)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return TrainResult(adapter_dir=out_dir, version=version, steps=len(plan), metrics=metrics)


def _behaviour_gap(rows, idx, logp, mask) -> float | None:
    """Mean |trainer logprob - sampler logprob| over tokens whose behaviour logprob is known."""
    total, count = 0.0, 0
    for j, i in enumerate(idx):
        beh = rows[i]["behaviour_logprobs"]
        if beh is None:
            continue
        n = len(beh)
        diff = (logp[j, :n].detach() - torch.tensor(beh, dtype=logp.dtype)).abs() * mask[j, :n]
        total += float(diff.sum())
        count += int(mask[j, :n].sum())
    return total / count if count else None


def _progress(total: int, enabled: bool):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm arrives with transformers; be quiet without it
        enabled = False
    if not enabled:
        class _Null:
            def update(self, n): ...
            def set_postfix(self, **kw): ...
            def close(self): ...
        return _Null()
    return tqdm(total=total, desc="grpo", unit="step")
