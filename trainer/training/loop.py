"""The LoRA policy trainer: GRPO-family updates from transitions, shared or per-agent policies.

Each run writes every trained adapter as a new version in standard PEFT format in its own
directory (``<adapters_root>/<name>/v0001``, ``v0002``, ...) with metadata, so serving never
reloads a directory in place, and a metrics line per step to ``metrics.jsonl``.

Objectives: ``grpo`` (the clipped policy gradient of the GRPO family, with its advantages) and
``sft`` (supervised fine-tuning on the completions of selected transitions: ``sft.py``).
With ``algorithm="ppo"`` the same clipped policy gradient takes per-token advantages from a
critic instead (``critic.py``: a value head per policy; ``gae.py``: GAE over an agent's turns),
and the clipped value loss joins it.

Policies (as in AT-GRPO): ``shared`` (one adapter for all roles), ``per_agent_lora`` (one peft
model holding one adapter per agent; each batch is routed to its agent's adapter, so an
adapter only ever learns from its own agent's data), ``per_agent_model`` (a separate model and
adapter per agent, trained one after the other).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import resource
import shutil
import time
import uuid
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from agl_bridge._version import __version__
from agl_bridge.trainer.adapters import METADATA_FILE, base_model_fingerprint, next_version_dir
from agl_bridge.trainer.rewards.advantages import group_advantages
from agl_bridge.trainer.rewards.credit import Algorithm
from agl_bridge.trainer.rewards.normalization import normalization_groups, normalize_rewards
from agl_bridge.trainer.rewards.selection import keep_by_spread
from agl_bridge.trainer.tracking import Tracker
from agl_bridge.trainer.training.checkpoints import (
    load_checkpoint,
    load_sharded_checkpoint,
    remove_unfinished_saves,
    resolve_checkpoint,
    save_checkpoint,
    save_sharded_checkpoint,
)
from agl_bridge.trainer.training.config import (
    GRPOConfig,
    NothingToTrain,
    Objective,
    Policy,
    TrainResult,
    check_algorithm,
)
from agl_bridge.trainer.training.critic import (
    ValueHeads,
    gae_targets,
    load_value_heads,
    mean_returns,
)
from agl_bridge.trainer.training.data import batches, collate, pack_rows, read_transitions
from agl_bridge.trainer.training.distributed import (
    all_reduce_grads,
    share_old_logprobs,
    world_and_rank,
)
from agl_bridge.trainer.training.losses import (
    clipped_value_loss,
    grpo_clip_loss,
    importance_weights,
)
from agl_bridge.trainer.training.model import (
    load_policy,
    packing_support,
    peft_name,
    trainable,
)
from agl_bridge.trainer.training.sft import select_for_sft, sft_loss
from agl_bridge.trainer.training.sharding import (
    PolicyForward,
    full_state,
    load_sharded,
    local_value,
)

logger = logging.getLogger(__name__)
# metrics lines' fields that are no curve: the x axis (micro-batch) and labels
TRACKED_APART = ("micro_batch", "adapter", "objective", "rank")

def train_policy(
    transitions: str | os.PathLike[str] | pa.Table,
    base_model: str | os.PathLike[str],
    adapters_root: str | os.PathLike[str],
    *,
    policy: Policy | None = None,
    adapter_name: str = "policy",
    config: GRPOConfig | None = None,
    init_adapters: dict[str, str | os.PathLike[str]] | None = None,
    metrics_path: str | os.PathLike[str] | None = None,
    progress: bool = True,
    keep_model: bool = False,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    resume_from_checkpoint: str | os.PathLike[str] | bool | None = None,
    objective: Objective | None = None,
    tracker: Tracker | None = None,
    algorithm: Algorithm | None = None,
    gamma: float = 1.0,
) -> TrainResult:
    """One round of policy updates; returns the new adapter version of each trained adapter.

    ``shared`` trains ``adapter_name``; the per-agent policies name each adapter after its
    agent (transitions without an agent go to ``adapter_name``). ``init_adapters`` continues
    from earlier versions (adapter name -> directory). With ``save_steps`` and
    ``checkpoint_dir``, the run checkpoints every N optimizer steps; ``resume_from_checkpoint``
    (a checkpoint directory, or True for the latest in ``checkpoint_dir``) continues it, with the
    same batches and the same loss trajectory as a run that was never stopped.
    ``objective``: ``grpo``, or ``sft`` (imitate the transitions ``cfg.sft_select`` picks).
    ``policy`` and ``objective`` default to the config's. ``tracker`` (``open_tracker``)
    gets each micro-batch's metrics as they are written (``train_from_traces`` opens one from
    ``report_to``). ``algorithm`` and ``gamma`` are the conversion's (``ConvertConfig``; None:
    not known, recorded so): ``ppo`` trains a value head beside each adapter and takes
    per-token GAE advantages from it (``gamma`` per generated token, ``cfg.lam``), ignoring
    the table's advantage column; the other algorithms train on the table's advantages.
    """
    cfg = config or GRPOConfig()
    policy = policy or cfg.policy
    objective = objective or cfg.objective
    if objective not in ("grpo", "sft"):
        raise ValueError(f"objective must be grpo or sft, got {objective!r}")
    check_algorithm(cfg, algorithm, objective)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    table = transitions if isinstance(transitions, pa.Table) else read_transitions(transitions)
    if table.num_rows == 0:
        raise NothingToTrain("no transitions to train on (see the converter's skip counts)")
    columns = ["prompt_ids", "completion_ids", "completion_mask", "reward", "group_id",
               "behaviour_logprobs", "agent_name", "episode_id"]
    columns += [c for c in ("advantage", "turn_index", "candidate_index", "task_id")
                if c in table.column_names]
    rows = table.select(columns).to_pylist()
    if cfg.train_agents is not None:
        wanted = set(cfg.train_agents)
        rows = [r for r in rows if r["agent_name"] in wanted]
        if not rows:
            raise NothingToTrain(f"no transitions of train_agents {sorted(wanted)} (agents in the "
                             f"data: {sorted({str(a) for a in table['agent_name'].to_pylist()})})")
    for i, r in enumerate(rows):
        if not math.isfinite(r["reward"]):
            raise ValueError(f"transition {i}: reward is {r['reward']}; refusing to train on it")
    # normalised over the whole batch, then filtered by the rewards as they were (RAGEN's order)
    normalised = _normalised_rewards(rows, cfg) if algorithm == "ppo" else None
    if cfg.rollout_filter_ratio < 1.0 and objective == "grpo":
        keep = keep_by_spread(np.array([r["reward"] for r in rows]),
                              np.array([str(r["group_id"]) for r in rows]),
                              cfg.rollout_filter_ratio)
        logger.info("agl_bridge: rollout filter (ratio %s) keeps %d of %d transitions",
                    cfg.rollout_filter_ratio, int(keep.sum()), len(rows))
        rows = [r for r, k in zip(rows, keep.tolist()) if k]
        normalised = normalised[keep] if normalised is not None else None
    if normalised is not None:
        for r, value in zip(rows, normalised.tolist()):
            r["reward"] = value
    if objective == "sft":
        keep = select_for_sft(np.array([r["reward"] for r in rows]),
                              np.array([str(r["group_id"]) for r in rows]), cfg.sft_select,
                              cfg.sft_min_reward)
        if not keep.any():
            raise NothingToTrain(
                f"SFT selected none of {len(rows)} transitions (sft_select="
                f"{cfg.sft_select!r}, sft_min_reward={cfg.sft_min_reward}): "
                + ("no group has a reward above another member's; give sft_min_reward"
                   if cfg.sft_select == "best" and cfg.sft_min_reward is None
                   else "no reward reaches sft_min_reward"))
        logger.info("agl_bridge: SFT on %d of %d transitions", int(keep.sum()), len(rows))
        rows = [r for r, k in zip(rows, keep.tolist()) if k]
        for r in rows:
            r["advantage"] = 0.0  # not used by the SFT loss
    elif algorithm == "ppo":
        for r in rows:
            r["advantage"] = 0.0  # GAE's, per token, from the critic (_train)
    elif not all(r.get("advantage") is not None for r in rows):
        groups = np.unique([str(r["group_id"]) for r in rows], return_inverse=True)[1]
        episodes = np.unique([str(r["episode_id"]) for r in rows], return_inverse=True)[1]
        advs, _, _ = group_advantages(np.array([r["reward"] for r in rows]), groups, episodes,
                                      eps=cfg.scale_rewards_eps)
        for r, a in zip(rows, advs.tolist()):
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
                         data=_data_range(transitions, table), objective=objective,
                         tracker=tracker, algorithm=algorithm, gamma=gamma)
            result.adapters.update(sub.adapters)
            result.steps += sub.steps
            result.metrics += sub.metrics
        return result
    names = sorted({r["adapter"] for r in rows})
    return _train(rows, base_model, adapters_root, names, cfg, init_adapters or {}, metrics_file,
                  progress, keep_model=keep_model, checkpoint_dir=checkpoint_dir,
                  resume=resume_from_checkpoint, data=_data_range(transitions, table),
                  objective=objective, tracker=tracker, algorithm=algorithm, gamma=gamma)


def _normalised_rewards(rows: list[dict[str, Any]], cfg: GRPOConfig) -> np.ndarray | None:
    """ppo: each transition's reward after ``reward_normalization`` (None: identity)."""
    norm = cfg.reward_normalization
    if norm.method == "identity":
        return None
    groups = normalization_groups(norm.grouping, [r.get("task_id") for r in rows],
                                  [r["agent_name"] for r in rows],
                                  [str(r["episode_id"]) for r in rows])
    out, n_groups, flat = normalize_rewards(
        np.array([r["reward"] for r in rows]),
        [(r["episode_id"], r["agent_name"], r.get("candidate_index")) for r in rows],
        [r.get("turn_index") for r in rows], groups, norm.method)
    logger.info("agl_bridge: rewards normalised (%s by %s) in %d group(s), %d without spread",
                norm.method, norm.grouping, n_groups, flat)
    return out


def _train(rows: list[dict[str, Any]], base_model, adapters_root, names: list[str],
           cfg: GRPOConfig, init_adapters, metrics_file: Path | None, progress: bool,
           keep_model: bool = False, checkpoint_dir=None, resume=None,
           data: dict[str, Any] | None = None, objective: Objective = "grpo",
           tracker: Tracker | None = None, algorithm: Algorithm | None = None,
           gamma: float = 1.0) -> TrainResult:
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    ppo = algorithm == "ppo"
    skipped_zero_variance = 0
    # a critic needs no spread within a group: production traffic has groups of one
    if cfg.filter_zero_variance_groups and objective == "grpo" and not ppo:
        by_group: dict[str, set[float]] = defaultdict(set)
        for r in rows:
            by_group[r["group_id"]].add(r["reward"])
        flat = {g for g, values in by_group.items() if len(values) < 2}
        skipped_zero_variance = sum(r["group_id"] in flat for r in rows)
        rows = [r for r in rows if r["group_id"] not in flat]
    world, rank = world_and_rank()  # the process group first: FSDP shards over it
    sharded = cfg.parallelism == "fsdp" and world > 1
    mixed = sharded and torch.cuda.is_available() and cfg.bf16 in (None, True)
    # ppo: a new value head starts at its round's mean return (value_head_init)
    value_start = (mean_returns(rows, gamma=gamma)
                   if ppo and cfg.value_head_init == "mean_return" else None)
    if sharded:  # ppo: the value heads sharded too (sharding.py says why)
        model, forward, device = load_sharded(base_model, cfg, names, init_adapters, mixed,
                                              critic=ppo, start=value_start)
    else:
        model, device = load_policy(base_model, cfg, names, init_adapters)
        forward = PolicyForward(model, load_value_heads(
            names, model.config.hidden_size, init_adapters, device, value_start)
            if ppo else None)
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    mask_dtype = torch.bfloat16 if mixed else model.dtype
    params = trainable(model)  # under FSDP: the ranks' shards (DTensors)
    heads = forward.critic
    head_params = list(heads.parameters()) if heads is not None else []
    groups: list[dict[str, Any]] = [{"params": params}]
    if head_params:
        groups.append({"params": head_params,
                       "lr": cfg.critic_learning_rate or 10 * cfg.learning_rate})
    # no weight decay (the HF and TRL default): an adapter without data must not move
    optimizer = torch.optim.AdamW(groups, lr=cfg.learning_rate, weight_decay=0.0)
    eps_high = cfg.epsilon if cfg.epsilon_high is None else cfg.epsilon_high
    max_len = cfg.max_completion_length or max((len(r["completion_ids"]) for r in rows),
                                               default=1)
    lengths = [len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows]
    can_pack, hidden_size, max_row = packing_support(model)
    pack = cfg.share_prompts and can_pack
    # a hash per prompt is enough to keep a group together (pack_rows compares the ids)
    keys = [hash(tuple(r["prompt_ids"])) for r in rows] if pack else None

    # Under FSDP every rank must train the same adapter in a step (sharding.py), so the plan
    # is shuffled in units of world x accumulation micro-batches of one adapter; an adapter's
    # last, incomplete unit is left out. The unit is 1 otherwise.
    unit = world * cfg.gradient_accumulation_steps if cfg.parallelism == "fsdp" else 1
    plan: list[tuple[str, list[int]]] = []  # (adapter, transition indices) per micro-batch
    left_out = 0
    for _ in range(cfg.num_train_epochs):
        units: list[list[tuple[str, list[int]]]] = []
        for name in names:
            mine = [i for i, r in enumerate(rows) if r["adapter"] == name]
            own = [(name, b) for b in batches(mine, cfg.per_device_train_batch_size, rng,
                                              lengths if cfg.group_by_length else None, keys)]
            whole = len(own) - len(own) % unit
            left_out += len(own) - whole
            units += [own[i:i + unit] for i in range(0, whole, unit)]
        rng.shuffle(units)
        plan += [m for u in units for m in u]
    if left_out:
        logger.info("agl_bridge: %d micro-batch(es) left out: FSDP steps take %d of one "
                    "adapter", left_out, unit)
    if world > 1:  # the same plan on every rank (same seed): each takes its share, equal counts
        share = len(plan) // world
        if share * world != len(plan):
            logger.info("agl_bridge: %d micro-batch(es) left out to split evenly over %d ranks",
                        len(plan) - share * world, world)
        plan = plan[rank::world][:share]
    bar = _progress(len(plan), progress and rank == 0, "ppo" if ppo else objective)
    old: dict[int, torch.Tensor] = {}  # logprobs under the pre-update policy, per transition
    targets: dict[int, torch.Tensor] = {}  # ppo: [values, advantages, returns] per transition
    metrics: list[dict[str, Any]] = []
    step = 0
    start = 0
    if checkpoint_dir is not None and rank == 0 and Path(checkpoint_dir).is_dir():
        gone = remove_unfinished_saves(checkpoint_dir)
        if gone:
            logger.info("agl_bridge: removed %d unfinished checkpoint save(s) in %s: %s",
                        len(gone), checkpoint_dir, gone)
    if resume:
        path = resolve_checkpoint(resume, checkpoint_dir)
        if sharded:
            start, step, metrics = load_sharded_checkpoint(path, forward, optimizer, old,
                                                           targets if ppo else None)
        else:
            start, step, metrics = load_checkpoint(path, model, optimizer, old, heads,
                                                   targets if ppo else None)
        bar.update(start)
    if heads is not None and not targets:  # from the weights before any update
        targets = _ppo_targets(forward, rows, cfg, gamma, pad_id, device, mask_dtype)
    # later epochs may put a transition on another rank than its first visit: every rank
    # gets each step's first-visit log-probabilities
    share_old = world > 1 and cfg.num_train_epochs > 1 and objective == "grpo"
    fresh: list[int] = []
    optimizer.zero_grad(set_to_none=True)
    for micro, (name, idx) in enumerate(plan):
        if micro < start:
            continue
        if cfg.max_steps is not None and step >= cfg.max_steps:
            break
        t0 = time.perf_counter()
        model.set_adapter(peft_name(name))
        if sharded:  # every adapter's shards stay trainable (sharding.all_lora_trainable)
            for p in params:
                p.requires_grad_(True)
        part = [rows[i] for i in idx]
        packing = pack_rows([r["prompt_ids"] for r in part],
                            [len(r["completion_ids"]) for r in part], hidden_size,
                            max_row) if pack else None
        batch = collate(part, pad_id, device, packing, mask_dtype)
        # ppo: one decoder pass for the policy and its value head
        logp, values = forward(batch, name if heads is not None else None)
        adv = torch.tensor([rows[i]["advantage"] for i in idx], device=device)
        gae = None
        if values is not None:  # [B, 3, C]: old values, advantages, returns
            gae = torch.stack([torch.nn.functional.pad(targets[i], (0, logp.shape[1] -
                                                                    targets[i].shape[1]))
                               for i in idx]).to(device)
            adv = gae[:, 1]
        if share_old:
            fresh += [i for i in idx if i not in old]
        if objective == "sft":
            loss = sft_loss(logp, batch["loss_mask"], cfg.loss_type, max_len)
            stats: dict[str, float] = {}
        else:
            loss, stats = _grpo_loss(forward, batch, logp, adv, idx,
                                     [len(r["completion_ids"]) for r in part], old, cfg,
                                     eps_high, max_len)
            if values is not None and gae is not None:
                value_loss, value_stats = clipped_value_loss(
                    values, gae[:, 0], gae[:, 2], batch["loss_mask"],
                    cliprange_value=cfg.cliprange_value)
                stats |= {"policy_loss": float(loss.detach()), **value_stats}
                loss = loss + cfg.vf_coef * value_loss
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {step} (adapter {name}, "
                                     f"transitions {idx})")
        (loss / cfg.gradient_accumulation_steps).backward()
        last = micro == len(plan) - 1
        grad_norm = value_grad_norm = float("nan")
        checkpoint_due = False
        if (micro + 1) % cfg.gradient_accumulation_steps == 0 or last:
            if world > 1 and not sharded:  # FSDP reduce-scatters in backward
                all_reduce_grads(params + head_params, world)
            if share_old:
                share_old_logprobs(old, fresh, device)
                fresh = []
            grad_norm = float(local_value(torch.nn.utils.clip_grad_norm_(params,
                                                                         cfg.max_grad_norm)))
            if head_params:  # apart: a large value error must not shrink the policy's step
                value_grad_norm = float(local_value(torch.nn.utils.clip_grad_norm_(
                    head_params, cfg.max_grad_norm)))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            checkpoint_due = bool(cfg.save_steps and checkpoint_dir
                                  and step % cfg.save_steps == 0)
        n_tokens = float(batch["loss_mask"].sum())
        rewards = [rows[i]["reward"] for i in idx]
        advs = adv.float()
        if advs.dim() == 2:  # per token (ppo): the trained tokens' only
            advs = advs[batch["loss_mask"] > 0]
        m: dict[str, Any] = {
            "step": step, "micro_batch": micro, "adapter": name, "loss": float(loss.detach()),
            "grad_norm": grad_norm, "reward_mean": sum(rewards) / len(rewards),
            "reward_std": float(torch.tensor(rewards).std()) if len(rewards) > 1 else 0.0,
            "advantage_mean": float(advs.mean()), "advantage_abs_mean": float(advs.abs().mean()),
            "tokens": n_tokens, "tokens_per_s": n_tokens / (time.perf_counter() - t0),
            "memory_mb": _memory_mb(device), "learning_rate": cfg.learning_rate,
            "skipped_zero_variance": skipped_zero_variance, "objective": objective, **stats,
        }
        if heads is not None:
            m["value_grad_norm"] = value_grad_norm
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
        if tracker is not None and rank == 0:
            tracker.log_metrics({k: v for k, v in m.items() if k not in TRACKED_APART}, micro,
                                prefix=f"train/{name}/")
        bar.update(1)
        bar.set_postfix(loss=f"{m['loss']:.4f}", adapter=name)
        if checkpoint_due and sharded:  # right after an optimizer step; every rank writes
            save_sharded_checkpoint(Path(checkpoint_dir), micro + 1, step, forward, optimizer,
                                    old, metrics, targets if ppo else None)
        elif checkpoint_due and rank == 0:
            save_checkpoint(Path(checkpoint_dir), micro + 1, step, model, optimizer, old,
                            metrics, heads, targets if ppo else None)
    bar.close()
    kept = model if keep_model else None
    kept_critic = heads if keep_model else None
    # a collective: all ranks gather
    gathered, gathered_critic = full_state(forward) if sharded else (None, None)
    if rank != 0:  # every rank holds the same weights; one writes them
        return TrainResult({}, step, metrics, metrics_file, kept, kept_critic)
    adapters = {name: _save(model, name, base_model, adapters_root, cfg, init_adapters,
                            sum(r["adapter"] == name for r in rows), step, metrics, data,
                            objective, gathered, heads, algorithm, gamma, gathered_critic)
                for name in names}
    return TrainResult(adapters, step, metrics, metrics_file, kept, kept_critic)


def _grpo_loss(forward: PolicyForward, batch: dict[str, torch.Tensor], logp: torch.Tensor,
               adv: torch.Tensor, idx: list[int], lengths: list[int],
               old: dict[int, torch.Tensor], cfg: GRPOConfig, eps_high: float,
               max_len: int) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy-gradient loss of one micro-batch; ``old`` keeps each transition's
    log-probabilities from its first visit (on-policy then; later epochs are clipped)."""
    width = logp.shape[1]
    for j, (i, n) in enumerate(zip(idx, lengths)):  # kept at its own length: a later epoch
        old.setdefault(i, logp[j, :n].detach().clone())  # pads it to another batch's width
    old_logp = torch.stack([torch.nn.functional.pad(old[i], (0, width - old[i].numel()))
                            for i in idx])
    ref = None
    if cfg.beta != 0.0:
        with torch.no_grad(), forward.model.disable_adapter():
            ref, _ = forward(batch)
    weights = None
    if cfg.vllm_importance_sampling_correction and batch["has_behaviour"].any():
        w = importance_weights(old_logp, batch["behaviour"], cfg.vllm_importance_sampling_cap)
        weights = torch.where(batch["has_behaviour"] > 0, w, torch.ones_like(w))
    return grpo_clip_loss(logp, old_logp, adv, batch["loss_mask"], epsilon_low=cfg.epsilon,
                          epsilon_high=eps_high, loss_type=cfg.loss_type,
                          max_completion_length=max_len, beta=cfg.beta, ref_logprobs=ref,
                          weights=weights)


def _ppo_targets(forward: PolicyForward, rows: list[dict[str, Any]], cfg: GRPOConfig,
                 gamma: float, pad_id: int, device: torch.device, mask_dtype: torch.dtype
                 ) -> dict[int, torch.Tensor]:
    """GAE targets of every transition from one no-grad pass of the critic before the update
    (``critic.gae_targets``), in eval mode (no dropout: the same values on every rank). Every
    rank computes them all (under FSDP each pass is a collective), so advantages are whitened
    over the same tokens as in one process."""
    def values_of(name: str, idx: list[int]) -> list[torch.Tensor]:
        forward.model.set_adapter(peft_name(name))
        batch = collate([rows[i] for i in idx], pad_id, device, None, mask_dtype)
        with torch.no_grad():
            _, v = forward(batch, name)
        return [v[j, :len(rows[i]["completion_ids"])] for j, i in enumerate(idx)]

    forward.eval()
    try:
        return gae_targets(rows, values_of, cfg.per_device_train_batch_size, gamma=gamma,
                           lam=cfg.lam)
    finally:
        forward.train()


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
          data: dict[str, Any] | None = None, objective: Objective = "grpo",
          state_dict: dict[str, torch.Tensor] | None = None, heads: ValueHeads | None = None,
          algorithm: Algorithm | None = None, gamma: float = 1.0,
          critic_state: dict[str, torch.Tensor] | None = None) -> Path:
    """One adapter -> a new version directory (written to a temporary name, then renamed).
    ``state_dict``: the weights gathered from the FSDP shards (the model holds only its own).
    ``heads``: PPO's critic, whose head for this adapter is saved beside it (``critic_state``:
    its weights gathered from the FSDP shards)."""
    version, out_dir = next_version_dir(adapters_root, name)
    tmp = out_dir.with_name(f".tmp-{uuid.uuid4().hex}-{out_dir.name}")
    extra = {} if state_dict is None else {"state_dict": state_dict}
    model.save_pretrained(str(tmp), selected_adapters=[peft_name(name)], **extra)
    inner = tmp / peft_name(name)  # PEFT saves a non-default adapter in a subfolder
    saved = inner if (inner / "adapter_config.json").exists() else tmp
    if heads is not None:
        heads.save(name, saved, critic_state)
    mine = [m for m in metrics if m["adapter"] == name]
    meta = {
        "agl_bridge_version": __version__, "adapter_name": name, "version": version,
        "base_model": str(Path(base_model).resolve()),
        "base_model_fingerprint": base_model_fingerprint(base_model),
        "init_adapter": str(init_adapters[name]) if name in init_adapters else None,
        "transitions": n_transitions, "steps": steps, "objective": objective,
        "algorithm": algorithm,
        "gae": {"gamma": gamma, "lam": cfg.lam} if heads is not None else None,
        "config": asdict(cfg), "data": data,
        "final_metrics": mine[-1] if mine else None, "created_unix": time.time(),
    }
    (saved / METADATA_FILE).write_text(json.dumps(meta, indent=2))
    try:
        saved.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


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


def _progress(total: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm  # a dependency of transformers

    return tqdm(total=total, desc=desc, unit="batch", disable=not enabled)
