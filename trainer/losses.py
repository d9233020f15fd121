"""GRPO pieces as pure functions: group advantages, token log-probabilities, the clipped loss.

Kept free of models and IO so each can be checked against a hand computation.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import torch


def group_advantages(rewards: Sequence[float], groups: Sequence[str], eps: float = 1e-4
                     ) -> list[float]:
    """(r - mean) / (std + eps) within each group; std is the sample std, as in TRL's GRPO.

    A group of one, or one whose rewards are all equal, carries no signal: advantage 0.
    """
    if len(rewards) != len(groups):
        raise ValueError(f"{len(rewards)} rewards but {len(groups)} group ids")
    members: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        if len(idx) < 2:
            continue
        values = [rewards[i] for i in idx]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        if std == 0.0:
            continue
        for i in idx:
            out[i] = (rewards[i] - mean) / (std + eps)
    return out


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position without building a full-vocabulary log-softmax tensor.

    ``logits``: [..., V] for the positions that predict ``targets`` [...].
    """
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()
    return picked - torch.logsumexp(logits.float(), dim=-1)


def grpo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clipped policy-gradient loss, averaged over the completion tokens in ``mask``.

    ``logprobs``/``old_logprobs``/``mask``: [B, T]; ``advantages``: [B] (one per sequence).
    Returns the loss and float statistics (clip fraction, mean ratio).
    """
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.unsqueeze(-1).to(logprobs.dtype)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    n_tokens = mask.sum().clamp(min=1.0)
    loss = (per_token * mask).sum() / n_tokens
    with torch.no_grad():
        was_clipped = ((unclipped - clipped).abs() > 0).to(mask.dtype)
        stats = {
            "clip_fraction": float((was_clipped * mask).sum() / n_tokens),
            "ratio_mean": float((ratio * mask).sum() / n_tokens),
        }
    return loss, stats
