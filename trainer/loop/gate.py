"""The gate: a candidate adapter goes live only if it is not worse than the live one.

Both are evaluated on the same held-out tasks (never trained on); per task the candidate's
score minus the live one's is a paired difference. Its mean and 95% interval (normal
approximation, standard error of the mean difference) decide:

* ``not_worse`` (default): publish unless the whole interval lies below ``-tolerance``: the
  candidate is refused only when it is worse beyond noise (and beyond the tolerance);
* ``better``: publish only if the whole interval lies above ``tolerance``;
* ``off``: always publish (the decision is still computed and recorded).

The team's score can hide a role that got worse: near 0 it cannot fall, and one role's gain can
carry another's loss. So each role whose adapter changed is gated on its own score too, under
``not_worse`` whatever the team's rule (a role need not improve, only not regress), and one
role's refusal refuses the candidate, unless the gate is ``partial``: then the roles that passed
go live and the refused ones keep their live versions (``decide``). Partial publishing is for
teams whose roles learn at different speeds (in MassGen's first round one agent's own answers
gained 12 points while the other's lost 11, and the whole candidate was refused); the
combination it publishes was never played as a whole, which is why the watch still judges it on
live rewards.

Pure: scores in, a decision with its rule and interval out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

GateRule = Literal["not_worse", "better", "off"]
RULES: tuple[GateRule, ...] = ("not_worse", "better", "off")
Z95 = 1.959964


@dataclass(frozen=True)
class GateDecision:
    publish: bool
    rule: str  # the rule as a sentence, with its numbers
    n: int  # tasks both were scored on
    live: float  # mean score
    candidate: float
    difference: float  # candidate - live, mean over tasks
    low: float  # 95% interval of the difference
    high: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Scores:
    """One version set's mean score per held-out task: the team's, and each role's own (role
    -> task -> score; empty when the team reports none)."""

    team: dict[str, float]
    roles: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"team": self.team, "roles": self.roles}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Scores:
        return cls(dict(data.get("team", {})), {k: dict(v) for k, v in
                                                data.get("roles", {}).items()})


def paired(live: Mapping[str, float], candidate: Mapping[str, float]
           ) -> tuple[int, float, float, float, float, float]:
    """(n, live mean, candidate mean, mean difference, low, high) over the shared tasks."""
    tasks = sorted(set(live) & set(candidate))
    n = len(tasks)
    if n == 0:
        return 0, math.nan, math.nan, math.nan, -math.inf, math.inf
    d = [candidate[t] - live[t] for t in tasks]
    mean = math.fsum(d) / n
    if n < 2:
        return n, live[tasks[0]], candidate[tasks[0]], mean, -math.inf, math.inf
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return (n, math.fsum(live[t] for t in tasks) / n,
            math.fsum(candidate[t] for t in tasks) / n, mean, mean - half, mean + half)


def gate(live: Mapping[str, float], candidate: Mapping[str, float], *,
         rule: GateRule = "not_worse", tolerance: float = 0.0) -> GateDecision:
    if rule not in RULES:
        raise ValueError(f"gate rule must be one of {RULES}, got {rule!r}")
    n, l_mean, c_mean, diff, low, high = paired(live, candidate)
    interval = f"[{low:+.3f}, {high:+.3f}]"
    if n == 0:
        return GateDecision(rule == "off", "no held-out task scored for both: refused"
                            if rule != "off" else "gate off", 0, l_mean, c_mean, diff, low, high)
    if rule == "not_worse":
        ok = high >= -tolerance
        text = (f"publish unless candidate - live < -{tolerance:g} beyond noise: mean "
                f"{diff:+.3f}, 95% interval {interval} over {n} tasks")
    elif rule == "better":
        ok = low > tolerance
        text = (f"publish only if candidate - live > {tolerance:g} beyond noise: mean "
                f"{diff:+.3f}, 95% interval {interval} over {n} tasks")
    else:
        ok = True
        text = f"gate off: mean difference {diff:+.3f}, 95% interval {interval}"
    return GateDecision(ok, text, n, l_mean, c_mean, diff, low, high)


@dataclass(frozen=True)
class Verdict:
    """The gate's outcome for one candidate: the team's decision, each changed role's, and the
    roles that go live (``published``; empty: refused). Decided once, in ``decide``, so what
    is logged, recorded and published cannot disagree."""

    team: GateDecision
    roles: dict[str, GateDecision]
    changed: list[str]
    published: list[str]

    @property
    def publish(self) -> bool:
        return bool(self.published)

    @property
    def headline(self) -> str:
        """What the log says first: REFUSED, publish, or publish some only."""
        if not self.published:
            return "REFUSED"
        if len(self.published) == len(self.changed):
            return "publish"
        return f"publish {', '.join(self.published)} only"

    def record(self, *, temperature: float, rollouts: int) -> dict[str, Any]:
        """The verdict as the loop records it in a round: the team's decision, the overall
        one, the reasons of a refusal (the team's rule and each worse role's), the decoding
        the versions were played with; under a partial gate, the roles that went live
        (``partial``) while others were refused."""
        reasons = ([] if self.team.publish else [self.team.rule]) + [
            f"role {a} worse: {d.rule}" for a, d in self.roles.items() if not d.publish]
        record = {**self.team.as_dict(), "publish": self.publish,
                  "team_publish": self.team.publish,
                  "rule": self.team.rule if not reasons else "; ".join(reasons),
                  "temperature": temperature, "rollouts": rollouts,
                  "roles": {a: d.as_dict() for a, d in self.roles.items()}}
        if reasons and self.published:
            record["partial"] = sorted(self.published)
        return record


def decide(live: Scores, candidate: Scores, changed: Iterable[str], *,
           rule: GateRule = "not_worse", tolerance: float = 0.0,
           partial: bool = False) -> Verdict:
    """Gate the team and each changed role (a role only where both versions have its scores;
    under ``off`` nothing is refused). All changed roles go live when the team and every gated
    role pass, none when the team fails; when only some roles fail, none, or under
    ``partial`` the others."""
    changed = list(dict.fromkeys(changed))
    team = gate(live.team, candidate.team, rule=rule, tolerance=tolerance)
    role_rule: GateRule = "off" if rule == "off" else "not_worse"
    roles = {r: gate(live.roles[r], candidate.roles[r], rule=role_rule, tolerance=tolerance)
             for r in sorted(changed) if live.roles.get(r) and candidate.roles.get(r)}
    refused = {a for a, d in roles.items() if not d.publish}
    published = ([] if not team.publish or (refused and not partial)
                 else [a for a in changed if a not in refused])
    return Verdict(team, roles, changed, published)
