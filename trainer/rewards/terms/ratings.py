"""How good an answer was, from the rewards and evaluations the episode already has: the
``quality`` of the coordination term and the ``rating`` behind ``votes`` with
``target = "best_rated"``.

Sources, as a recipe names them:

* ``"task"`` (quality): the sum of the episode's reward spans scoped ``episode`` or ``team``
  (the task's own reward: what the whole run earned);
* ``"rewards"`` (rating): per agent, the sum of the reward spans scoped to that agent or to one
  of its turns, plus the evaluations joined to that agent;
* ``"evaluation:NAME"``: the evaluations named NAME (a judge's, feedback), as the converter
  joined them, so the recipe's ``[evaluations]`` weight applies (unset: weight 1, the score).
  Quality: the mean of those scored on the selected agent when there are any, else the mean of
  all of them in the episode; rating: per agent, the mean of those joined to it.

Derived rewards of other terms never count: a source is what was recorded, so terms do not
depend on each other's order. An episode (or agent) the source says nothing about has no value:
the caller decides what that means, and notes it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc
from agl_bridge.trainer.rewards.terms.base import EPISODE_KEY, Evaluations, RecipeError

EVALUATION_PREFIX = "evaluation:"
REWARD_COLUMNS = ("span_id", "reward_value", "reward_scope", "agent_name")
_LOCAL = (sc.RewardScope.AGENT, sc.RewardScope.TURN)
_TEAM = (None, sc.RewardScope.EPISODE, sc.RewardScope.TEAM)  # no scope: the episode's


@dataclass(frozen=True)
class Source:
    kind: str  # task | rewards | evaluation
    evaluation: str | None = None  # the evaluation name, for kind "evaluation"

    def __str__(self) -> str:
        return self.kind if self.evaluation is None else EVALUATION_PREFIX + self.evaluation


TASK = Source("task")  # quality: the episode's team reward
REWARDS = Source("rewards")  # rating: the agent's rewards and evaluations


def source(config: Mapping[str, Any], key: str, default: Source, where: str) -> Source:
    """The default's kind (``task`` or ``rewards``) or ``evaluation:NAME``."""
    value = config.get(key, str(default))
    plain = default.kind
    if value == plain:
        return Source(plain)
    if isinstance(value, str) and value.startswith(EVALUATION_PREFIX) and \
            value[len(EVALUATION_PREFIX):]:
        return Source("evaluation", value[len(EVALUATION_PREFIX):])
    raise RecipeError(f"{where}.{key}: expected {plain!r} or 'evaluation:NAME', got {value!r}")


def _reward_rows(spans: pa.Table) -> list[dict[str, Any]]:
    """The unit's reward spans (finite values, each span id once)."""
    rows = spans.select([EPISODE_KEY, *REWARD_COLUMNS]).filter(
        pc.is_valid(spans["reward_value"])).to_pylist()
    seen: set[str] = set()
    out = []
    for r in rows:
        if r["span_id"] in seen or not math.isfinite(r["reward_value"]):
            continue
        seen.add(r["span_id"])
        out.append(r)
    return out


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def episode_quality(spans: pa.Table, evaluations: Evaluations, src: Source,
                    selected: Mapping[str, str | None]) -> dict[str, float]:
    """Episode key -> quality of its final answer, for the episodes of ``selected`` (episode
    -> its selected agent) that the source has a value for."""
    out: dict[str, float] = {}
    if src.kind == "task":
        team: dict[str, list[float]] = defaultdict(list)
        for r in _reward_rows(spans):
            if r[EPISODE_KEY] in selected and r["reward_scope"] in _TEAM:
                team[r[EPISODE_KEY]].append(r["reward_value"])
        return {e: math.fsum(v) for e, v in team.items()}
    for episode, agent in selected.items():
        named = [e for e in evaluations.get(episode, ()) if e.name == src.evaluation]
        own = [e.value for e in named if agent is not None and e.agent == agent]
        value = _mean(own) if own else _mean([e.value for e in named])
        if value is not None:
            out[episode] = value
    return out


def agent_ratings(spans: pa.Table, evaluations: Evaluations, src: Source,
                  episodes: set[str]) -> dict[str, dict[str, float]]:
    """Episode key -> agent -> rating, for ``episodes``; unrated agents are absent."""
    out: dict[str, dict[str, float]] = {}
    if src.kind == "rewards":
        summed: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in _reward_rows(spans):
            if r[EPISODE_KEY] in episodes and r["reward_scope"] in _LOCAL and \
                    r["agent_name"] is not None:
                summed[r[EPISODE_KEY]][r["agent_name"]].append(r["reward_value"])
        for episode in episodes:
            for e in evaluations.get(episode, ()):
                if e.agent is not None:
                    summed[episode][e.agent].append(e.value)
        return {ep: {a: math.fsum(v) for a, v in agents.items()} for ep, agents in summed.items()}
    for episode in episodes:
        by_agent: dict[str, list[float]] = defaultdict(list)
        for e in evaluations.get(episode, ()):
            if e.name == src.evaluation and e.agent is not None:
                by_agent[e.agent].append(e.value)
        if by_agent:
            out[episode] = {a: math.fsum(v) / len(v) for a, v in by_agent.items()}
    return out
