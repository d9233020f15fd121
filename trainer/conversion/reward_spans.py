"""Reward spans -> the rewards of each episode, summed per scope.

Rewards are matched within their episode only, never by time across episodes (with episodes
running concurrently, matching by time hands one episode's reward to another's calls).
A non-finite reward is rejected with its place (episode, span, file).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from agl_bridge import semconv as sc
from agl_bridge.trainer.arrow import arr
from agl_bridge.trainer.conversion import reasons
from agl_bridge.trainer.conversion.columns import episode_keys
from agl_bridge.trainer.conversion.config import ConversionStats
from agl_bridge.trainer.rewards.evaluations import EvaluationReward
from agl_bridge.trainer.rewards.recipes import Derived, RecipeReward

# the span columns reward matching reads
REWARD_COLUMNS = ["trace_id", "span_id", "episode_id", "agent_name", "turn_index",
                  "candidate_index", "reward_value", "reward_scope"]


@dataclass(frozen=True)
class Reward:
    """A reward span reduced to what matching needs."""

    episode: str
    value: float
    scope: str | None  # turn, agent, team, episode (None: episode)
    agent: str | None = None
    turn: int | None = None
    candidate: int | None = None  # a turn reward for one tree-sampled candidate only


class EpisodeRewards:
    """Rewards of one episode, summed per scope key."""

    def __init__(self) -> None:
        self.team = 0.0
        self.has_team = False
        self.agent: dict[str | None, float] = defaultdict(float)
        # (agent, turn, candidate): candidate None is the whole agent-turn's
        self.turn: dict[tuple[str | None, int | None, int | None], float] = defaultdict(float)

    def add(self, r: Reward | RecipeReward) -> str | None:
        """Add one reward; returns why it cannot be used, or None."""
        scope = r.scope or sc.RewardScope.EPISODE
        if scope in (sc.RewardScope.EPISODE, sc.RewardScope.TEAM):
            self.team += r.value
            self.has_team = True
        elif scope == sc.RewardScope.AGENT:
            if r.agent is None:
                return reasons.AGENT_REWARD_WITHOUT_AGENT
            self.agent[r.agent] += r.value
        elif scope == sc.RewardScope.TURN:
            if r.agent is None or r.turn is None:
                return reasons.TURN_REWARD_WITHOUT_TURN
            self.turn[(r.agent, r.turn, getattr(r, "candidate", None))] += r.value
        else:
            return reasons.unknown_reward_scope(scope)
        return None

    def fill(self, value: float) -> None:
        """An episode without a reward given ``value`` as its team reward (``missing_reward``)."""
        self.team, self.has_team = float(value), True

    def local(self, agent: str | None, turn: int | None, candidate: int | None = None, *,
              with_agent: bool = True, turn_scores: bool = True) -> float:
        """The rewards scoped to ``agent`` and to its ``turn``, and for a tree-sampled
        ``candidate`` of that turn, those scoped to that candidate too. ``with_agent=False``:
        the turn's only (PPO places the agent's on its last turn). ``turn_scores=False``
        (``use_turn_scores``): a turn's rewards count as the agent's, for its whole episode
        (a candidate's stay its own: they are what tree sampling compares)."""
        own_turn = self.turn.get((agent, turn, None), 0.0) if turn_scores else 0.0
        agent_part = 0.0
        if with_agent:
            agent_part = self.agent.get(agent, 0.0)
            if not turn_scores:
                agent_part += math.fsum(v for (a, _, c), v in self.turn.items()
                                        if a == agent and c is None)
        value = agent_part + own_turn
        if candidate is not None:
            value += self.turn.get((agent, turn, candidate), 0.0)
        return value

    @property
    def has_local(self) -> bool:
        return bool(self.agent or self.turn)

    @property
    def empty(self) -> bool:
        return not (self.has_team or self.agent or self.turn)


def read_rewards(table: pa.Table, stats: ConversionStats, source: str = ""
                 ) -> dict[str, EpisodeRewards]:
    """Episode key -> its rewards, from the reward rows of ``table`` (``REWARD_COLUMNS``).
    ``source`` names where the rows came from, for the rejected-reward messages."""
    out: dict[str, EpisodeRewards] = defaultdict(EpisodeRewards)
    if table.num_rows == 0:
        return out
    episodes = arr(episode_keys(table)).to_pylist()
    values = table["reward_value"].to_pylist()
    scopes: list[str | None] = _column(table, "reward_scope")
    agents: list[str | None] = _column(table, "agent_name")
    turns: list[int | None] = _column(table, "turn_index")
    candidates: list[int | None] = _column(table, "candidate_index")
    span_ids = table["span_id"].to_pylist()
    seen: set[str] = set()
    for i, value in enumerate(values):
        if span_ids[i] in seen:
            stats.notes[reasons.DUPLICATE_SPAN] += 1
            continue
        seen.add(span_ids[i])
        if not math.isfinite(value):
            stats.notes[reasons.NON_FINITE_REWARD] += 1
            if len(stats.rejected_rewards) < stats.MAX_LISTED:
                stats.rejected_rewards.append(
                    f"{value} in episode {episodes[i]}, span {span_ids[i]}{source}")
            continue
        why = out[episodes[i]].add(Reward(episodes[i], value, scopes[i], agents[i], turns[i],
                                          candidates[i]))
        if why:
            stats.notes[why + reasons.IGNORED_SUFFIX] += 1
    return out


def add_evaluations(rewards: dict[str, EpisodeRewards], episodes: list[str],
                    extra: Mapping[str, list[EvaluationReward]], stats: ConversionStats) -> None:
    """The evaluations of ``episodes`` (those present in the rows being converted) added to
    their rewards; each episode lies in exactly one unit, so each counts once."""
    for episode in episodes:
        for r in extra.get(episode, ()):
            why = rewards[episode].add(Reward(episode, r.value, r.scope, r.agent, r.turn))
            if why:
                stats.notes[why + reasons.IGNORED_SUFFIX] += 1


def add_recipe(rewards: dict[str, EpisodeRewards], derived: Derived,
               stats: ConversionStats) -> None:
    """Rewards a recipe derived from the unit's spans, added to their episodes' rewards and
    counted per term and agent for the summary; what its terms left out, counted in the
    notes."""
    stats.notes.update(derived.notes)
    totals: dict[tuple[str, str | None], list[float]] = defaultdict(list)
    for r in derived.rewards:  # a per-call term derives one per LLM call: kept lean
        why = rewards[r.episode].add(r)
        if why:
            stats.notes[why + reasons.IGNORED_SUFFIX] += 1
            continue
        totals[(r.term, r.agent)].append(r.value)
    for key, values in totals.items():
        stats.recipe[key] += math.fsum(values)
        stats.recipe_rewards[key] += len(values)


def _column(table: pa.Table, name: str) -> list[Any]:
    return table[name].to_pylist() if name in table.column_names else [None] * table.num_rows
