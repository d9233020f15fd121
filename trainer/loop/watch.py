"""Watching a version that went live: roll back when live reward falls below that of the best
recent version by more than a margin, beyond noise.

After a publish the loop keeps reading the live rewards of the episodes each version served
(inline, feedback, recipe, judge: whatever conversion gives them), by policy version. Once the
new version has ``min_episodes`` rewarded episodes, it is kept unless its mean reward is below
the best of the last few versions' (``best_recent``; only the previous one's let a slide over
two versions pass, each step within noise) by more than ``margin`` *and* the 95% interval of
the difference (Welch, normal approximation) lies wholly below zero: noise alone never triggers
a rollback.

Pure: rewards in, a decision with its reason out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from agl_bridge.trainer.loop.gate import Z95

Verdict = Literal["wait", "keep", "rollback"]


@dataclass(frozen=True)
class WatchDecision:
    verdict: Verdict
    reason: str
    previous: float
    current: float
    n_previous: int
    n_current: int
    low: float
    high: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean_var(x: Sequence[float]) -> tuple[float, float]:
    n = len(x)
    mean = math.fsum(x) / n
    var = math.fsum((v - mean) ** 2 for v in x) / (n - 1) if n > 1 else 0.0
    return mean, var


def best_recent(recent: Sequence[tuple[str, Sequence[float]]]) -> int:
    """Index of the version (``(key, rewards)``, oldest first: those live before the current
    one) the current one is judged against: the highest mean reward among those with two
    rewarded episodes or more; the newest when none has."""
    scored = [(math.fsum(r) / len(r), i) for i, (_, r) in enumerate(recent) if len(r) >= 2]
    return max(scored)[1] if scored else len(recent) - 1


def watch(previous: Sequence[float], current: Sequence[float], *, margin: float = 0.0,
          min_episodes: int = 32) -> WatchDecision:
    """``previous``: rewards of the episodes the previous version served; ``current``: of
    those the new version served since it went live."""
    if len(current) < min_episodes or len(previous) < 2:
        return WatchDecision("wait", f"{len(current)} of {min_episodes} episodes served by the "
                             f"new version so far", math.nan, math.nan, len(previous),
                             len(current), -math.inf, math.inf)
    p_mean, p_var = _mean_var(previous)
    c_mean, c_var = _mean_var(current)
    diff = c_mean - p_mean
    half = Z95 * math.sqrt(p_var / len(previous) + c_var / len(current))
    low, high = diff - half, diff + half
    worse = diff < -margin and high < 0
    reason = (f"live reward {c_mean:.3f} over {len(current)} episodes vs {p_mean:.3f} before "
              f"({len(previous)}): difference {diff:+.3f}, 95% interval [{low:+.3f}, "
              f"{high:+.3f}], margin {margin:g}")
    return WatchDecision("rollback" if worse else "keep", reason, p_mean, c_mean,
                         len(previous), len(current), low, high)
