"""Held-out success against wall-clock minutes, from the adapters each run saved (pure functions).

``learning_vs_trl.py`` records, for every run of an arm, the adapters a user would have had
and when: ``points``, a list of ``{"s": seconds since the run's process was started,
"adapter": key}`` sorted by time, the first ``{"s": 0, "adapter": "base"}``. The evaluator
gives each key its held-out successes ``{"k": right answers, "n": tasks}``. A run's success at
minute ``m`` is that of the adapter it had then: the last point at or before ``m`` (a step
function: an adapter saved at 7.9 minutes counts from 7.9 on). Runs of one arm are pooled
(successes and tasks added, one Wilson interval), and their spread is the lowest and highest
run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from agl_bridge.trainer.loop.report import wilson

Points = Sequence[Mapping[str, Any]]
Evals = Mapping[str, Mapping[str, int]]


def live_at(points: Points, seconds: float) -> str:
    """The adapter a run had ``seconds`` after it started."""
    live = points[0]["adapter"]
    for p in points:
        if p["s"] > seconds:
            break
        live = p["adapter"]
    return live


def rate(evals: Evals, key: str) -> float:
    e = evals[key]
    return e["k"] / e["n"]


def pooled(keys: Sequence[str], evals: Evals) -> dict[str, Any]:
    """One arm's runs at one time: their successes added (Wilson 95%), and the lowest and
    highest run."""
    rates = [rate(evals, k) for k in keys]
    out = wilson(sum(evals[k]["k"] for k in keys), sum(evals[k]["n"] for k in keys))
    return {**out, "runs": len(keys), "run_min": min(rates), "run_max": max(rates)}


def marks(budget_s: float, count: int) -> list[float]:
    """``count`` equal steps of the budget, 0 included."""
    return [budget_s * j / count for j in range(count + 1)]


def curve(runs: Sequence[Points], evals: Evals, times: Sequence[float]) -> list[dict[str, Any]]:
    """The arm's pooled success at each of ``times`` (seconds)."""
    return [{"s": t, **pooled([live_at(points, t) for points in runs], evals)} for t in times]


def final(runs: Sequence[Points], evals: Evals) -> dict[str, Any]:
    """The arm's pooled success with each run's last adapter."""
    return pooled([points[-1]["adapter"] for points in runs], evals)


def first_reach(points: Points, evals: Evals, target: float) -> float | None:
    """When the run first had an adapter at least ``target`` on the held-out set (None:
    never)."""
    return next((p["s"] for p in points if rate(evals, p["adapter"]) >= target), None)


def reach(runs: Sequence[Points], evals: Evals, target: float) -> dict[str, Any]:
    """Each run's first time at ``target`` and their median (a run that never got there counts
    as later than any that did; None when the median run never did)."""
    per_run = [first_reach(points, evals, target) for points in runs]
    middle = statistics.median([math.inf if s is None else s for s in per_run])
    return {"per_run": per_run, "median": None if math.isinf(middle) else middle}


def summary(arms: Mapping[str, Sequence[Points]], evals: Evals, budget_s: float, count: int,
            reference: str = "trl") -> dict[str, Any]:
    """Every arm's curve on the same marks, its final success, where the runs started (the
    first points: the base model), and when each arm first reached the reference arm's final
    success (pooled)."""
    times = marks(budget_s, count)
    finals = {arm: final(runs, evals) for arm, runs in arms.items() if runs}
    target = finals[reference]["rate"] if reference in finals else None
    start = pooled([points[0]["adapter"] for runs in arms.values() for points in runs], evals)
    return {"budget_s": budget_s, "target": target, "reference": reference, "start": start,
            "curves": {arm: curve(runs, evals, times) for arm, runs in arms.items() if runs},
            "final": finals,
            "reach": {} if target is None else
            {arm: reach(runs, evals, target) for arm, runs in arms.items() if runs}}


def _cell(p: Mapping[str, Any]) -> str:
    spread = (f" ({p['run_min']:.0%}..{p['run_max']:.0%})" if p["runs"] > 1 else "")
    return f"{p['rate']:6.1%} [{p['low']:.1%}, {p['high']:.1%}]{spread}"


def table(result: Mapping[str, Any]) -> str:
    """The curves as text: one row per mark, one column per arm."""
    arms = list(result["curves"])
    head = f"{'minute':>7}  " + "  ".join(f"{a:<36}" for a in arms)
    rows = [head, "-" * len(head)]
    for i, point in enumerate(result["curves"][arms[0]]):
        rows.append(f"{point['s'] / 60:>7.2f}  " + "  ".join(
            f"{_cell(result['curves'][a][i]):<36}" for a in arms))
    return "\n".join(row.rstrip() for row in rows)


def reach_lines(result: Mapping[str, Any]) -> list[str]:
    """When each arm first reached the reference's final success, and the target's verdict:
    at most half the reference's budget."""
    if result["target"] is None:
        return []
    budget = result["budget_s"]
    lines = [f"first time at {result['reference']}'s final success "
             f"({result['target']:.1%}), per run, minutes:"]
    for arm, r in result["reach"].items():
        runs = ", ".join("never" if s is None else f"{s / 60:.1f}" for s in r["per_run"])
        median = "never" if r["median"] is None else f"{r['median'] / 60:.1f}"
        lines.append(f"  {arm}: {runs} (median {median})")
    if result["target"] <= result["start"]["rate"]:
        lines.append(f"target undecided: {result['reference']}'s final success is not above "
                     f"where the runs started ({result['start']['rate']:.1%}, the base model)")
        return lines
    for arm, r in result["reach"].items():
        if arm == result["reference"]:
            continue
        met = r["median"] is not None and r["median"] <= budget / 2
        lines.append(f"target ({arm} at {result['reference']}'s final success within half its "
                     f"{budget / 60:.0f} minutes, median run): {'met' if met else 'not met'}")
    return lines
