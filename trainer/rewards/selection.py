"""Which transitions to imitate: the selection rule of supervised fine-tuning from traces
(``objective="sft"``) and of ``agl-bridge export --format sft``. Pure numpy, no torch.

Two ways to say "went well":

* ``best``: in each group (a task's candidates for one agent-turn under AT-GRPO grouping), the
  transitions with the group's highest reward (all of them on a tie). Without ``min_reward``,
  only in groups where that reward is above some other member's (a group whose members all
  scored the same says nothing about which to imitate); with it, only where the best reaches
  ``min_reward`` (so a lone rollout that succeeded counts, and a group's best failure not);
* ``threshold``: every transition with reward at least ``min_reward`` (production traffic,
  where tasks do not repeat and groups have one member).

Checked on tables in ``tests/trainer/training/test_sft.py``.
"""

from __future__ import annotations

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
