"""Which transitions to train on: the selection rule of supervised fine-tuning from traces
(``objective="sft"``) and of ``agl-bridge export --format sft``; and the rollout filter of
multi-turn PPO (``rollout_filter_ratio``). Pure numpy, no torch.

Two ways to say "went well":

* ``best``: in each group (a task's candidates for one agent-turn under AT-GRPO grouping), the
  transitions with the group's highest reward (all of them on a tie). Without ``min_reward``,
  only in groups where that reward is above some other member's (a group whose members all
  scored the same says nothing about which to imitate); with it, only where the best reaches
  ``min_reward`` (so a lone rollout that succeeded counts, and a group's best failure not);
* ``threshold``: every transition with reward at least ``min_reward`` (production traffic,
  where tasks do not repeat and groups have one member).

The rollout filter (``keep_by_spread``, RAGEN's ``rollout_filter_ratio`` on verl) keeps the
groups whose rewards spread most: a group whose rollouts all scored alike teaches a
group-relative update little, and a critic's update little more than it already knows.

Checked on tables in ``tests/trainer/training/test_sft.py`` and ``test_data_knobs.py``.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

SftSelect = Literal["best", "threshold"]


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


def keep_by_spread(rewards: np.ndarray, groups: np.ndarray, ratio: float) -> np.ndarray:
    """A boolean mask over transitions: those of the ``ratio`` share of groups (rounded up)
    whose rewards spread most, by their standard deviation (population: a group of one has
    0); on equal spread the group met first wins. ``ratio`` 1 keeps every transition."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"rollout_filter_ratio must be in (0, 1], got {ratio!r}")
    rewards = np.asarray(rewards, dtype=np.float64)
    if ratio == 1.0 or len(rewards) == 0:
        return np.ones(len(rewards), dtype=bool)
    _, first, code = np.unique(np.asarray(groups), return_index=True, return_inverse=True)
    code = code.reshape(-1)
    n = len(first)
    count = np.bincount(code, minlength=n)
    mean = np.bincount(code, weights=rewards, minlength=n) / count
    std = np.sqrt(np.bincount(code, weights=(rewards - mean[code]) ** 2, minlength=n) / count)
    order = np.lexsort((first, -std))  # by spread, largest first; then by first row
    kept = np.zeros(n, dtype=bool)
    kept[order[:math.ceil(ratio * n)]] = True
    return kept[code]
