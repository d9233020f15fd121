"""Batch reward normalisation: the multi-turn PPO design's ``reward_normalization`` (RAGEN's, on
verl), as pure numpy functions.

RAGEN normalises each trajectory's score within a group before the advantage estimator sees it:

* grouping: ``state`` (the rollouts that started from the same state: here the same task, and
  the same agent, since a team's agents are trajectories of their own), ``inductive`` (RAGEN's
  environment tag, a kind of problem across states: here the agent, whose role is the kind of
  problem its turns solve) or ``batch`` (every trajectory of the batch together);
* method: ``identity`` (as they are), ``mean`` (the group's mean subtracted), ``mean_std``
  (standardised, ``(x - mean) / (std + 1e-6)``, std the sample one; a group without spread,
  std at most 1e-6 or one member, gets 0) or ``asym_clip`` (``mean_std`` clipped to [-1, 3]: a
  failure costs at most one standard deviation, a success may earn three).

A trajectory here is a *chain*: one agent's turns in one episode (a tree-sampled candidate's
own), as PPO's GAE walks them (``trainer/training/gae.py``), and its score is the sum of its
turns' rewards. Rewards without ``use_turn_scores`` all sit on the chain's last turn, so this is
RAGEN's normalisation exactly. With turn scores (which RAGEN refuses) the chain's total is
normalised all the same, and spread over its turns: every turn's reward is multiplied by the
group's scale (``1 / (std + 1e-6)``, or 1 for ``mean``) and the rest of the change (the mean,
the clip) lands on the last turn, so the turns still sum to the normalised score.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

Grouping = Literal["state", "batch", "inductive"]
NormalizationMethod = Literal["identity", "mean", "mean_std", "asym_clip"]
ASYM_CLIP = (-1.0, 3.0)  # RAGEN's bounds of a standardised score
EPS = 1e-6  # added to the std; a std at most this is no spread (RAGEN's, stable in bf16)


def normalization_groups(grouping: Grouping, task: Sequence[str | None],
                         agent: Sequence[str | None], episode: Sequence[str]) -> np.ndarray:
    """Group codes per transition: ``state`` (task, agent; without a task its episode stands
    in, a group of its own), ``inductive`` (agent), ``batch`` (one group)."""
    if grouping == "batch":
        return np.zeros(len(episode), np.int64)
    if grouping == "inductive":
        keys = [str(a) for a in agent]
    elif grouping == "state":
        keys = [f"task:{t}|agent:{a}" if t is not None else f"episode:{e}|agent:{a}"
                for t, a, e in zip(task, agent, episode)]
    else:
        raise ValueError(f"reward_normalization.grouping must be state, batch or inductive, "
                         f"got {grouping!r}")
    return np.unique(np.asarray(keys, dtype=object), return_inverse=True)[1].reshape(-1)


def _scores(total: np.ndarray, group: np.ndarray, method: NormalizationMethod
            ) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Each chain's normalised score and the scale of its turn rewards; (groups, groups
    without spread)."""
    _, inv = np.unique(group, return_inverse=True)
    inv = inv.reshape(-1)
    k = int(inv.max()) + 1
    count = np.bincount(inv, minlength=k)
    mean = np.bincount(inv, weights=total, minlength=k) / count
    centred = total - mean[inv]
    var = np.bincount(inv, weights=centred ** 2, minlength=k) / np.maximum(count - 1, 1)
    std = np.where(count > 1, np.sqrt(var), 0.0)
    flat = std <= EPS
    if method == "mean":
        return centred, np.ones(len(total)), k, int(flat.sum())
    scale = np.where(flat, 0.0, 1.0 / (std + EPS))[inv]
    score = centred * scale
    if method == "asym_clip":
        score = np.clip(score, *ASYM_CLIP)
    return score, scale, k, int(flat.sum())


def normalize_rewards(reward: np.ndarray, chain: Sequence[object], turn: Sequence[int | None],
                      group: np.ndarray, method: NormalizationMethod
                      ) -> tuple[np.ndarray, int, int]:
    """Each transition's reward after normalising its chain's score within its group;
    (rewards, groups, groups without spread).

    ``reward`` [N]; ``chain`` [N]: which chain each transition is in (any values equal within
    a chain); ``turn`` [N]: its turn (None first; the chain's last turn, the last row among
    equals, holds the correction); ``group`` [N]: ``normalization_groups`` (a chain's group is
    its last turn's)."""
    reward = np.asarray(reward, np.float64)
    if method not in ("identity", "mean", "mean_std", "asym_clip"):
        raise ValueError(f"reward_normalization.method must be identity, mean, mean_std or "
                         f"asym_clip, got {method!r}")
    n = len(reward)
    if method == "identity" or n == 0:
        return reward.copy(), 0, 0
    inv = np.unique(np.asarray([repr(c) for c in chain], dtype=object),
                    return_inverse=True)[1].reshape(-1)
    k = int(inv.max()) + 1
    order = np.array([-1 if t is None else int(t) for t in turn], np.int64)
    by_chain = np.lexsort((np.arange(n), order, inv))  # each chain's rows, last one last
    ends = np.flatnonzero(np.diff(inv[by_chain], append=k))
    last = by_chain[ends]  # chain c's last row, c = 0 .. k-1
    total = np.bincount(inv, weights=reward, minlength=k)
    score, scale, groups, flat = _scores(total, np.asarray(group)[last], method)
    out = reward * scale[inv]
    out[last] += score - scale * total
    return out, groups, flat
