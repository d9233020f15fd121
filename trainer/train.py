"""The LoRA policy trainer: GRPO-family updates from transitions, shared or per-agent policies.

Each run writes every trained adapter as a new version in standard PEFT format in its own
directory (``<adapters_root>/<name>/v0001``, ``v0002``, ...) with metadata, so serving never
reloads a directory in place, and a metrics line per step to ``metrics.jsonl``.

Policies (as in AT-GRPO): ``shared`` (one adapter for all roles), ``per_agent_lora`` (one peft
model holding one adapter per agent; each batch is routed to its agent's adapter, so an
adapter only ever learns from its own agent's data), ``per_agent_model`` (a separate model and
adapter per agent, trained one after the other).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import resource
import shutil
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import torch

from agl_bridge._version import __version__
from agl_bridge.parquet_io import read_checked
from agl_bridge.schema import REQUIRED_TRANSITION_COLUMNS
from agl_bridge.trainer.credit import advantages as group_advantages
from agl_bridge.trainer.losses import (
    LossType,
    grpo_clip_loss,
    importance_weights,
    linear_token_logprobs,
    token_logprobs,
)

logger = logging.getLogger(__name__)

METADATA_FILE = "agl_bridge_adapter.json"
Policy = Literal["shared", "per_agent_lora", "per_agent_model"]


@dataclass
class GRPOConfig:
    """Names follow TRL's GRPOConfig (and HF TrainingArguments) where the concept is the same."""

    learning_rate: float = 1e-4
    num_train_epochs: int = 1  # passes over the transitions (later passes are off-policy: clip)
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    epsilon: float = 0.2  # clip range low
    epsilon_high: float | None = None  # clip range high (defaults to epsilon)
    loss_type: LossType = "bnpo"  # grpo (sequence mean), bnpo/dapo (token mean), dr_grpo
    max_completion_length: int | None = None  # dr_grpo's constant; default: longest in data
    beta: float = 0.0  # KL(policy || base) weight, k3 estimator; base = adapter disabled
    vllm_importance_sampling_correction: bool = True  # weight by pi_old / pi_sampler
    vllm_importance_sampling_cap: float = 2.0
    filter_zero_variance_groups: bool = True  # nothing to learn from them: skip the compute
    max_grad_norm: float = 1.0
    seed: int = 0
    group_by_length: bool = False  # batches of similar length: less padding
    gradient_checkpointing: bool = False
    bf16: bool | None = None  # default: on when training on a GPU
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    scale_rewards_eps: float = 1e-4
    max_steps: int | None = None  # stop after this many optimizer steps
    save_steps: int | None = None  # checkpoint every N optimizer steps (needs checkpoint_dir)


@dataclass
class TrainResult:
    adapters: dict[str, Path]  # adapter name -> new version directory
    steps: int
    metrics: list[dict[str, Any]]
    metrics_path: Path | None = None
    model: Any = None  # the trained peft model, when asked for (keep_model=True)

    @property
    def adapter_dir(self) -> Path:  # the single adapter of a shared policy
        return next(iter(self.adapters.values()))

    @property
    def version(self) -> int:
        return int(self.adapter_dir.name.lstrip("v"))


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


# -- batches ----------------------------------------------------------------------------------
def _batches(indices: list[int], size: int, rng: random.Random, lengths: list[int] | None
             ) -> list[list[int]]:
    order = list(indices)
    rng.shuffle(order)
    if lengths is not None:  # similar lengths together, batch order still shuffled
        order.sort(key=lambda i: lengths[i])
        batches = [order[i:i + size] for i in range(0, len(order), size)]
        rng.shuffle(batches)
        return batches
    return [order[i:i + size] for i in range(0, len(order), size)]


def _collate(rows: list[dict[str, Any]], pad_id: int, device: torch.device
             ) -> dict[str, torch.Tensor]:
    """Right-padded prompt+completion; ``targets`` and ``loss_mask`` cover completion tokens;
    ``behaviour`` holds the sampler's logprobs where known (``has_behaviour``)."""
    seqs = [r["prompt_ids"] + r["completion_ids"] for r in rows]
    width = max(len(s) for s in seqs)
    comp_width = max(len(r["completion_ids"]) for r in rows)
    b = len(rows)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    positions = torch.zeros((b, comp_width), dtype=torch.long)  # logits predicting token j
    targets = torch.full((b, comp_width), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((b, comp_width), dtype=torch.float32)
    behaviour = torch.zeros((b, comp_width), dtype=torch.float32)
    has_behaviour = torch.zeros((b, comp_width), dtype=torch.float32)
    for i, (r, s) in enumerate(zip(rows, seqs)):
        p, c = len(r["prompt_ids"]), len(r["completion_ids"])
        input_ids[i, : len(s)] = torch.tensor(s)
        attention[i, : len(s)] = 1
        positions[i, :c] = torch.arange(p - 1, p - 1 + c)
        targets[i, :c] = torch.tensor(r["completion_ids"])
        loss_mask[i, :c] = torch.tensor(r["completion_mask"], dtype=torch.float32)
        if r.get("behaviour_logprobs") is not None:
            behaviour[i, :c] = torch.tensor(r["behaviour_logprobs"], dtype=torch.float32)
            has_behaviour[i, :c] = 1.0
    out = {"input_ids": input_ids, "attention_mask": attention, "positions": positions,
           "targets": targets, "loss_mask": loss_mask, "behaviour": behaviour,
           "has_behaviour": has_behaviour}
    return {k: v.to(device) for k, v in out.items()}


def completion_logprobs(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Log-probabilities of the completion tokens. The LM head runs on completion positions only,
    and (a plain linear head, the usual case) in tiles whose logits are recomputed in backward
    (``linear_token_logprobs``): no [batch, completion, vocabulary] logits tensor is kept for
    backward, which with gradient checkpointing was most of the step's live memory."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(lm, lm.base_model_prefix)  # the decoder stack without its LM head
    head = model.get_output_embeddings()
    hidden = body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                  use_cache=False).last_hidden_state
    idx = batch["positions"].unsqueeze(-1).expand(-1, -1, hidden.size(-1))
    picked = hidden.gather(1, idx)  # [B, C, H]
    if type(head) is not torch.nn.Linear:  # e.g. a LoRA-wrapped head: its own forward
        return token_logprobs(head(picked), batch["targets"])
    b, c, h = picked.shape
    return linear_token_logprobs(picked.reshape(b * c, h), head.weight,
                                 batch["targets"].reshape(b * c), head.bias).view(b, c)


# -- model ------------------------------------------------------------------------------------
def _device_and_dtype(cfg: GRPOConfig) -> tuple[torch.device, torch.dtype]:
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16 if cfg.bf16 in (None, True) else torch.float32
    return torch.device("cpu"), torch.bfloat16 if cfg.bf16 else torch.float32


def _load(base_model, cfg: GRPOConfig, adapter_names: list[str],
          init_adapters: dict[str, str | os.PathLike[str]]):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    device, dtype = _device_and_dtype(cfg)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype).to(device)
    if cfg.gradient_checkpointing:
        # non-reentrant (the default of transformers 5, not of 4.x): it needs no inputs that
        # require grad, and recomputes only what backward asks for
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()  # what peft does anyway, and harmless
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=cfg.lora_target_modules, task_type="CAUSAL_LM")
    first, *rest = adapter_names
    if first in init_adapters:
        model = PeftModel.from_pretrained(model, str(init_adapters[first]),
                                          adapter_name=_peft_name(first), is_trainable=True)
    else:
        model = get_peft_model(model, lora, adapter_name=_peft_name(first))
    for name in rest:
        if name in init_adapters:
            model.load_adapter(str(init_adapters[name]), adapter_name=_peft_name(name),
                               is_trainable=True)
        else:
            model.add_adapter(_peft_name(name), lora)
    model.train()
    return model, device


def _peft_name(name: str) -> str:
    """Agent names are user data; PEFT adapter names become module keys and must not be part of
    the ``lora_`` prefix (an adapter called ``a`` is reinitialised on load)."""
    return "agl_" + re.sub(r"[^0-9A-Za-z_]", "_", name)


def _distributed() -> tuple[int, int]:
    """(world size, rank); under torchrun the process group is started here (gloo on CPU,
    nccl on GPU)."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 1, 0
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_world_size(), dist.get_rank()


def _all_reduce_grads(params: list[torch.nn.Parameter], world: int) -> None:
    """Average gradients over the ranks. Parameters with no gradient on any rank keep None, so
    the optimizer leaves them exactly as they are (per-agent adapters: ranks may be training
    different agents in the same step)."""
    import torch.distributed as dist

    had = torch.tensor([p.grad is not None for p in params], dtype=torch.float32,
                       device=params[0].device)
    dist.all_reduce(had)
    for p, n in zip(params, had.tolist()):
        if n == 0:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= world


def _trainable(model) -> list[torch.nn.Parameter]:
    # every adapter's LoRA weights (set_adapter marks only the active one trainable)
    return [p for n, p in model.named_parameters() if "lora_" in n]


# -- training ---------------------------------------------------------------------------------
def train_policy(
    transitions: str | os.PathLike[str] | pa.Table,
    base_model: str | os.PathLike[str],
    adapters_root: str | os.PathLike[str],
    *,
    policy: Policy = "shared",
    adapter_name: str = "policy",
    config: GRPOConfig | None = None,
    init_adapters: dict[str, str | os.PathLike[str]] | None = None,
    metrics_path: str | os.PathLike[str] | None = None,
    progress: bool = True,
    keep_model: bool = False,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    resume_from_checkpoint: str | os.PathLike[str] | bool | None = None,
) -> TrainResult:
    """One round of policy updates; returns the new adapter version of each trained adapter.

    ``shared`` trains ``adapter_name``; the per-agent policies name each adapter after its
    agent (transitions without an agent go to ``adapter_name``). ``init_adapters`` continues
    from earlier versions (adapter name -> directory). With ``save_steps`` and
    ``checkpoint_dir``, the run checkpoints every N optimizer steps; ``resume_from_checkpoint``
    (a checkpoint directory, or True for the latest in ``checkpoint_dir``) continues it, with the
    same batches and the same loss trajectory as a run that was never stopped.
    """
    cfg = config or GRPOConfig()
    table = transitions if isinstance(transitions, pa.Table) else read_transitions(transitions)
    if table.num_rows == 0:
        raise ValueError("no transitions to train on (see the converter's skip counts)")
    columns = ["prompt_ids", "completion_ids", "completion_mask", "reward", "group_id",
               "behaviour_logprobs", "agent_name", "episode_id"]
    if "advantage" in table.column_names:
        columns.append("advantage")
    rows = table.select(columns).to_pylist()
    for i, r in enumerate(rows):
        if not math.isfinite(r["reward"]):
            raise ValueError(f"transition {i}: reward is {r['reward']}; refusing to train on it")
    if not all(r.get("advantage") is not None for r in rows):
        advs, _ = group_advantages([r["reward"] for r in rows], [r["group_id"] for r in rows],
                                   [r["episode_id"] for r in rows], eps=cfg.scale_rewards_eps)
        for r, a in zip(rows, advs):
            r["advantage"] = a
    for r in rows:
        r["adapter"] = adapter_name if policy == "shared" else (r["agent_name"] or adapter_name)

    metrics_file = Path(metrics_path) if metrics_path else None
    if policy == "per_agent_model":
        result = TrainResult({}, 0, [], metrics_file)
        for name in sorted({r["adapter"] for r in rows}):
            part = [r for r in rows if r["adapter"] == name]
            sub = _train(part, base_model, adapters_root, [name], cfg, init_adapters or {},
                         metrics_file, progress, keep_model=False,
                         data=_data_range(transitions, table))
            result.adapters.update(sub.adapters)
            result.steps += sub.steps
            result.metrics += sub.metrics
        return result
    names = sorted({r["adapter"] for r in rows})
    return _train(rows, base_model, adapters_root, names, cfg, init_adapters or {}, metrics_file,
                  progress, keep_model=keep_model, checkpoint_dir=checkpoint_dir,
                  resume=resume_from_checkpoint, data=_data_range(transitions, table))


def _train(rows: list[dict[str, Any]], base_model, adapters_root, names: list[str],
           cfg: GRPOConfig, init_adapters, metrics_file: Path | None, progress: bool,
           keep_model: bool = False, checkpoint_dir=None, resume=None,
           data: dict[str, Any] | None = None) -> TrainResult:
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    skipped_zero_variance = 0
    if cfg.filter_zero_variance_groups:
        by_group: dict[str, set[float]] = defaultdict(set)
        for r in rows:
            by_group[r["group_id"]].add(r["reward"])
        flat = {g for g, values in by_group.items() if len(values) < 2}
        skipped_zero_variance = sum(r["group_id"] in flat for r in rows)
        rows = [r for r in rows if r["group_id"] not in flat]
    model, device = _load(base_model, cfg, names, init_adapters)
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    params = _trainable(model)
    # no weight decay (the HF and TRL default): an adapter without data must not move
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
    world, rank = _distributed()
    eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    max_len = cfg.max_completion_length or max((len(r["completion_ids"]) for r in rows),
                                               default=1)
    lengths = [len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows]

    plan: list[tuple[str, list[int]]] = []  # (adapter, transition indices) per micro-batch
    for _ in range(cfg.num_train_epochs):
        epoch = []
        for name in names:
            mine = [i for i, r in enumerate(rows) if r["adapter"] == name]
            epoch += [(name, b) for b in _batches(mine, cfg.per_device_train_batch_size, rng,
                                                  lengths if cfg.group_by_length else None)]
        rng.shuffle(epoch)
        plan += epoch
    if world > 1:  # the same plan on every rank (same seed): each takes its share, equal counts
        share = len(plan) // world
        if share * world != len(plan):
            logger.info("agl_bridge: %d micro-batch(es) left out to split evenly over %d ranks",
                        len(plan) - share * world, world)
        plan = plan[rank::world][:share]
    bar = _progress(len(plan), progress and rank == 0)
    old: dict[int, torch.Tensor] = {}  # logprobs under the pre-update policy, per transition
    metrics: list[dict[str, Any]] = []
    step = 0
    start = 0
    if resume:
        start, step, metrics = _load_checkpoint(resume, checkpoint_dir, model, optimizer, old)
        bar.update(start)
    optimizer.zero_grad(set_to_none=True)
    for micro, (name, idx) in enumerate(plan):
        if micro < start:
            continue
        if cfg.max_steps is not None and step >= cfg.max_steps:
            break
        t0 = time.perf_counter()
        model.set_adapter(_peft_name(name))
        batch = _collate([rows[i] for i in idx], pad_id, device)
        logp = completion_logprobs(model, batch)
        for j, i in enumerate(idx):  # first visit: on-policy (ratio 1); later epochs clip
            old.setdefault(i, logp[j].detach().clone())
        old_logp = torch.stack([old[i] for i in idx])
        ref = None
        if cfg.beta != 0.0:
            with torch.no_grad(), model.disable_adapter():
                ref = completion_logprobs(model, batch)
        weights = None
        if cfg.vllm_importance_sampling_correction and batch["has_behaviour"].any():
            w = importance_weights(old_logp, batch["behaviour"], cfg.vllm_importance_sampling_cap)
            weights = torch.where(batch["has_behaviour"] > 0, w, torch.ones_like(w))
        adv = torch.tensor([rows[i]["advantage"] for i in idx], device=device)
        loss, stats = grpo_clip_loss(logp, old_logp, adv, batch["loss_mask"],
                                     epsilon_low=cfg.epsilon, epsilon_high=eps_high,
                                     loss_type=cfg.loss_type, max_completion_length=max_len,
                                     beta=cfg.beta, ref_logprobs=ref, weights=weights)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {step} (adapter {name}, "
                                     f"transitions {idx})")
        (loss / cfg.gradient_accumulation_steps).backward()
        last = micro == len(plan) - 1
        grad_norm = float("nan")
        checkpoint_due = False
        if (micro + 1) % cfg.gradient_accumulation_steps == 0 or last:
            if world > 1:
                _all_reduce_grads(params, world)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            checkpoint_due = cfg.save_steps and checkpoint_dir and step % cfg.save_steps == 0
        n_tokens = float(batch["loss_mask"].sum())
        rewards = [rows[i]["reward"] for i in idx]
        advs = adv.float()
        m: dict[str, Any] = {
            "step": step, "micro_batch": micro, "adapter": name, "loss": float(loss.detach()),
            "grad_norm": grad_norm, "reward_mean": sum(rewards) / len(rewards),
            "reward_std": float(torch.tensor(rewards).std()) if len(rewards) > 1 else 0.0,
            "advantage_mean": float(advs.mean()), "advantage_abs_mean": float(advs.abs().mean()),
            "tokens": n_tokens, "tokens_per_s": n_tokens / (time.perf_counter() - t0),
            "memory_mb": _memory_mb(device), "learning_rate": cfg.learning_rate,
            "skipped_zero_variance": skipped_zero_variance, **stats,
        }
        gap = _behaviour_gap(logp, batch)
        if gap is not None:
            m["behaviour_logprob_abs_diff"] = gap
        if world > 1:
            m["rank"] = rank
        metrics.append(m)
        if metrics_file is not None and rank == 0:
            metrics_file.parent.mkdir(parents=True, exist_ok=True)
            with open(metrics_file, "a") as f:
                f.write(json.dumps(m) + "\n")
        bar.update(1)
        bar.set_postfix(loss=f"{m['loss']:.4f}", adapter=name)
        if checkpoint_due and rank == 0:  # right after an optimizer step
            _save_checkpoint(Path(checkpoint_dir), micro + 1, step, model, optimizer, old,
                             metrics)
    bar.close()
    kept = model if keep_model else None
    if rank != 0:  # every rank holds the same weights; one writes them
        return TrainResult({}, step, metrics, metrics_file, kept)
    adapters = {name: _save(model, name, base_model, adapters_root, cfg, init_adapters,
                            sum(r["adapter"] == name for r in rows), step, metrics, data)
                for name in names}
    return TrainResult(adapters, step, metrics, metrics_file, kept)


def _save_checkpoint(root: Path, next_micro: int, step: int, model, optimizer,
                     old: dict[int, torch.Tensor], metrics: list[dict[str, Any]]) -> Path:
    """Everything a resumed run needs to continue as if never stopped (atomic directory)."""
    out = root / f"checkpoint-{step}"
    tmp = root / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    torch.save({
        "next_micro_batch": next_micro, "step": step,
        "lora": {n: p.detach().cpu() for n, p in model.named_parameters() if "lora_" in n},
        "optimizer": optimizer.state_dict(), "old_logprobs": old,
        "torch_rng": torch.get_rng_state(), "metrics": metrics,
    }, tmp / "state.pt")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    found = sorted(Path(root).glob("checkpoint-[0-9]*"), key=lambda p: int(p.name.split("-")[1]))
    return found[-1] if found else None


def _load_checkpoint(resume, checkpoint_dir, model, optimizer, old) -> tuple[int, int, list]:
    path = latest_checkpoint(checkpoint_dir) if resume is True else Path(resume)
    if path is None or not (path / "state.pt").exists():
        raise FileNotFoundError(f"no checkpoint to resume from in {resume if resume is not True else checkpoint_dir}")
    state = torch.load(path / "state.pt", weights_only=False)
    params = dict(model.named_parameters())
    missing = [n for n in state["lora"] if n not in params]
    if missing:
        raise ValueError(f"{path}: checkpoint does not fit this model/adapters "
                         f"(unknown parameters, e.g. {missing[0]})")
    with torch.no_grad():
        for n, v in state["lora"].items():
            params[n].copy_(v)
    optimizer.load_state_dict(state["optimizer"])
    old.update(state["old_logprobs"])
    torch.set_rng_state(state["torch_rng"])
    return state["next_micro_batch"], state["step"], state["metrics"]


def _data_range(source, table: pa.Table) -> dict[str, Any]:
    """What a version was trained on: the transitions file, rows, episodes and time span."""
    info: dict[str, Any] = {"transitions_file": None if isinstance(source, pa.Table)
                            else str(Path(source).resolve()), "rows": table.num_rows}
    if "episode_id" in table.column_names:
        info["episodes"] = len(set(table["episode_id"].to_pylist()))
    if "start_time_unix_nano" in table.column_names and table.num_rows:
        times = [t for t in table["start_time_unix_nano"].to_pylist() if t is not None]
        if times:
            info["first_start_unix_nano"], info["last_start_unix_nano"] = min(times), max(times)
    return info


def _save(model, name: str, base_model, adapters_root, cfg: GRPOConfig, init_adapters,
          n_transitions: int, steps: int, metrics: list[dict[str, Any]],
          data: dict[str, Any] | None = None) -> Path:
    """One adapter -> a new version directory (written to a temporary name, then renamed)."""
    version, out_dir = next_version_dir(adapters_root, name)
    tmp = out_dir.with_name(f".tmp-{uuid.uuid4().hex}-{out_dir.name}")
    model.save_pretrained(str(tmp), selected_adapters=[_peft_name(name)])
    inner = tmp / _peft_name(name)  # PEFT saves a non-default adapter in a subfolder
    saved = inner if (inner / "adapter_config.json").exists() else tmp
    mine = [m for m in metrics if m["adapter"] == name]
    meta = {
        "agl_bridge_version": __version__, "adapter_name": name, "version": version,
        "base_model": str(Path(base_model).resolve()),
        "base_model_fingerprint": base_model_fingerprint(base_model),
        "init_adapter": str(init_adapters[name]) if name in init_adapters else None,
        "transitions": n_transitions, "steps": steps, "config": asdict(cfg), "data": data,
        "final_metrics": mine[-1] if mine else None, "created_unix": time.time(),
    }
    (saved / METADATA_FILE).write_text(json.dumps(meta, indent=2))
    try:
        saved.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def train_grpo(transitions, base_model, adapters_root, *, adapter_name: str = "policy",
               config: GRPOConfig | None = None, init_adapter=None, progress: bool = True,
               metrics_path=None) -> TrainResult:
    """One adapter for everything (the shared policy)."""
    return train_policy(transitions, base_model, adapters_root, policy="shared",
                        adapter_name=adapter_name, config=config,
                        init_adapters={adapter_name: init_adapter} if init_adapter else None,
                        metrics_path=metrics_path, progress=progress)


def _behaviour_gap(logp: torch.Tensor, batch: dict[str, torch.Tensor]) -> float | None:
    """Mean |trainer logprob - sampler logprob| over tokens whose sampler logprob is known."""
    known = batch["has_behaviour"] * batch["loss_mask"]
    n = float(known.sum())
    if n == 0:
        return None
    return float(((logp.detach() - batch["behaviour"]).abs() * known).sum() / n)


def _memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
    return tqdm(total=total, desc="grpo", unit="batch")
