"""Supervised fine-tuning from traces: which transitions to imitate, and the loss.

Rejection-sampling fine-tuning keeps the rollouts that went well and trains the policy to
produce them again, with no advantage and no clipping. Two ways to say "went well":

* ``best``: in each group (a task's candidates for one agent-turn under AT-GRPO grouping), the
  transitions with the group's highest reward (all of them on a tie). Without ``min_reward``,
  only in groups where that reward is above some other member's (a group whose members all
  scored the same says nothing about which to imitate); with it, only where the best reaches
  ``min_reward`` (so a lone rollout that succeeded counts, and a group's best failure not);
* ``threshold``: every transition with reward at least ``min_reward`` (production traffic,
  where tasks do not repeat and groups have one member).

Pure functions of arrays, checked on tables in ``tests/trainer/training/test_sft.py``.
"""

from __future__ import annotations

import numpy as np
import torch

from agl_bridge.trainer.training.config import LossType, SftSelect
from agl_bridge.trainer.training.losses import aggregate


def select_for_sft(rewards: np.ndarray, groups: np.ndarray, how: SftSelect = "best",
                   min_reward: float | None = None) -> np.ndarray:
    """A boolean mask over transitions: the ones supervised fine-tuning imitates.

    ``rewards`` [N] floats, ``groups`` [N] group codes (any values that compare equal within a
    group). See the module docstring for ``best`` and ``threshold``.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    if how == "threshold":
        if min_reward is None:
            raise ValueError("sft_select='threshold' needs sft_min_reward")
        return rewards >= min_reward
    if how != "best":
        raise ValueError(f"sft_select must be best or threshold, got {how!r}")
    if len(rewards) == 0:
        return np.zeros(0, dtype=bool)
    _, code = np.unique(np.asarray(groups), return_inverse=True)
    code = code.reshape(-1)
    n = int(code.max()) + 1
    top = np.full(n, -np.inf)
    low = np.full(n, np.inf)
    np.maximum.at(top, code, rewards)
    np.minimum.at(low, code, rewards)
    good = top > low if min_reward is None else top >= min_reward
    return (rewards == top[code]) & good[code]


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, loss_type: LossType = "bnpo",
             max_completion_length: int | None = None) -> torch.Tensor:
    """Negative log-likelihood of the completion tokens in ``mask`` [B, T], averaged as
    ``loss_type`` says (``bnpo``: over the batch's tokens; ``grpo``: per sequence first)."""
    return aggregate(-logprobs, mask, loss_type, max_completion_length)
