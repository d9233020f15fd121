"""Group-relative advantages: how much better a transition did than its group.

``(r - mean) / (std + eps)`` per group (GRPO), or ``r - mean`` (``scale=False``, Dr. GRPO).
``unit="transition"``: every transition counts once in its group's mean and std;
``unit="rollout"``: each episode counts once (its transitions in the group share the mean of
their rewards in the statistics), so an episode with many calls does not outweigh the others.
A group of one, or of equal rewards, gets exactly 0 and is counted as zero-variance.

The sums are ``math.fsum`` per group, so results do not depend on row order. Rewards too
large to square or sum (beyond about 1e150) are handled on values scaled by a power of two, so
any finite reward gives a finite advantage; a mean-centred advantage beyond the float range is
clamped to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from agl_bridge.trainer.rewards.credit import AdvantageUnit

# beyond this, squaring (or summing a few) rewards overflows a float: scale the group first
_BIG = 2.0**500


def mean_of(values: Sequence[float]) -> float:
    """The mean, correctly rounded (``math.fsum``), and exactly the value when all are equal:
    the rounded sum of n equal values divided by n can miss it by an ulp, which made a group
    of equal rewards look like one with variance (std 1e-17 instead of 0)."""
    first = values[0]
    if all(v == first for v in values):
        return first
    try:
        return math.fsum(values) / len(values)
    except OverflowError:  # the sum leaves the float range: sum values divided by 2**k >= n
        f = math.ldexp(1.0, (len(values) - 1).bit_length())
        return math.fsum(v / f for v in values) / len(values) * f


def group_advantages(reward: np.ndarray, group: np.ndarray, episode: np.ndarray, *,
                     unit: AdvantageUnit = "transition", scale: bool = True, eps: float = 1e-4
                     ) -> tuple[np.ndarray, int, int]:
    """(advantage per transition, number of groups, groups with zero variance).

    ``group`` and ``episode`` are integer codes per transition (equal value, same group)."""
    reward = np.asarray(reward, np.float64)
    group = np.asarray(group)
    n = len(reward)
    out = np.zeros(n, np.float64)
    if not (len(group) == len(episode) == n):
        raise ValueError(f"{n} rewards, {len(group)} groups, {len(episode)} episodes")
    if n == 0:
        return out, 0, 0
    order = np.argsort(group, kind="stable")
    g_sorted = group[order]
    bounds = np.flatnonzero(g_sorted[1:] != g_sorted[:-1]) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [n]))
    n_groups = len(starts)
    r_sorted = reward[order].tolist()
    e_sorted = np.asarray(episode)[order].tolist() if unit == "rollout" else None
    mean = np.zeros(n_groups)
    std = np.zeros(n_groups)
    shift = np.zeros(n_groups, np.int64)  # the group's values were divided by 2**shift
    use = np.zeros(n_groups, bool)
    zero_var = 0
    fsum, sqrt = math.fsum, math.sqrt
    for k, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        if e_sorted is not None:
            per: dict[object, list[float]] = {}
            for v, e in zip(r_sorted[a:b], e_sorted[a:b]):
                per.setdefault(e, []).append(v)
            values = [mean_of(v) for v in per.values()]
        else:
            if b - a < 2:
                continue
            values = r_sorted[a:b]
        m = len(values)
        if m < 2:
            continue
        if min(values) == max(values):  # exactly: fsum([0.1] * 3) / 3 is not 0.1
            zero_var += 1
            continue
        e = 0
        big = max(abs(min(values)), abs(max(values)))
        if big > _BIG:
            e = math.frexp(big)[1]
            values = [math.ldexp(v, -e) for v in values]
        mu = fsum(values) / m
        sd = sqrt(fsum((v - mu) ** 2 for v in values) / (m - 1))
        if sd == 0.0:
            zero_var += 1
            continue
        mean[k], std[k], shift[k], use[k] = mu, sd, e, True
    gk = np.repeat(np.arange(n_groups), ends - starts)
    e_t = shift[gk]
    centred = np.ldexp(np.asarray(r_sorted), -e_t) - mean[gk]  # exact: powers of two
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        if scale:
            adv_sorted = centred / (std[gk] + np.ldexp(eps, -e_t))
        else:
            big_float = np.finfo(np.float64).max
            adv_sorted = np.clip(np.ldexp(centred, e_t), -big_float, big_float)
    out[order] = np.where(use[gk], adv_sorted, 0.0)
    return out, n_groups, zero_var
