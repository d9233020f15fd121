"""Credit assignment and grouping: pure functions from rewards and transition keys to numbers.

Two algorithms, as in the design documents:

* LightningRL (Agent Lightning): identical assignment. Every transition of an episode gets the
  episode's reward (the sum of its episode- and team-scoped rewards); groups are tasks.
* AT-GRPO (PettingLLMs): agent- and turn-wise. A transition's reward mixes the team's reward with
  its own: ``r = alpha * team + local``, where ``local`` is the sum of the rewards scoped to its
  agent and to its agent-turn. Groups are ``(task, agent, turn)``, so the K candidates sampled for
  one agent-turn (tree sampling) are compared with each other and never with another task's.

``gamma`` discounts the team reward over an agent's turns: turn t of an agent whose last turn in
the episode is T gets ``gamma ** (T - t)`` of it (1.0: no discount).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agl_bridge import semconv as sc

Algorithm = Literal["at_grpo", "lightning_rl"]
AdvantageUnit = Literal["transition", "rollout"]


@dataclass(frozen=True)
class Reward:
    """A reward span reduced to what matching needs."""

    episode: str
    value: float
    scope: str | None  # turn, agent, team, episode (None: episode)
    agent: str | None = None
    turn: int | None = None


@dataclass(frozen=True)
class Key:
    """Where a transition sits: what rewards and groups are matched on."""

    episode: str
    task: str | None
    agent: str | None
    turn: int | None
    candidate: int | None = None


class EpisodeRewards:
    """Rewards of one episode, summed per scope key."""

    def __init__(self) -> None:
        self.team = 0.0
        self.has_team = False
        self.agent: dict[str | None, float] = defaultdict(float)
        self.turn: dict[tuple[str | None, int | None], float] = defaultdict(float)

    def add(self, r: Reward) -> str | None:
        """Add one reward; returns why it cannot be used, or None."""
        scope = r.scope or sc.RewardScope.EPISODE
        if scope in (sc.RewardScope.EPISODE, sc.RewardScope.TEAM):
            self.team += r.value
            self.has_team = True
        elif scope == sc.RewardScope.AGENT:
            if r.agent is None:
                return "agent-scoped reward without an agent"
            self.agent[r.agent] += r.value
        elif scope == sc.RewardScope.TURN:
            if r.agent is None or r.turn is None:
                return "turn-scoped reward without agent and turn"
            self.turn[(r.agent, r.turn)] += r.value
        else:
            return f"unknown reward scope {scope!r}"
        return None

    @property
    def empty(self) -> bool:
        return not (self.has_team or self.agent or self.turn)


def transition_reward(key: Key, rewards: EpisodeRewards, *, algorithm: Algorithm,
                      alpha: float = 1.0, gamma: float = 1.0, last_turn: int | None = None
                      ) -> float:
    discount = 1.0
    if gamma != 1.0 and key.turn is not None and last_turn is not None:
        discount = gamma ** (last_turn - key.turn)
    team = rewards.team * discount
    if algorithm == "lightning_rl":
        return team
    local = rewards.agent.get(key.agent, 0.0) + rewards.turn.get((key.agent, key.turn), 0.0)
    return alpha * team + local


def group_key(key: Key, algorithm: Algorithm) -> str:
    """AT-GRPO: (task, agent, turn); LightningRL: task. Without a task id the episode stands in,
    which makes a group of one: no signal, counted, never merged into another task's group."""
    task = f"task:{key.task}" if key.task is not None else f"episode:{key.episode}"
    if algorithm == "lightning_rl":
        return task
    return f"{task}|agent:{key.agent}|turn:{key.turn}"


def mean_of(values: Sequence[float]) -> float:
    """The mean, correctly rounded (``math.fsum``), and exactly the value when all are equal:
    the rounded sum of n equal values divided by n can miss it by an ulp, which made a group
    of equal rewards look like one with variance (std 1e-17 instead of 0)."""
    first = values[0]
    if all(v == first for v in values):
        return first
    return math.fsum(values) / len(values)


def advantages(rewards: Sequence[float], groups: Sequence[str], episodes: Sequence[str], *,
               unit: AdvantageUnit = "transition", scale: bool = True, eps: float = 1e-4
               ) -> tuple[list[float], int]:
    """Group-relative advantages, and the number of groups with zero variance.

    ``unit="transition"``: every transition counts once in its group's mean and std.
    ``unit="rollout"``: each episode counts once (its transitions in the group share one reward
    value in the statistics), so an episode with many calls does not outweigh the others.
    ``scale``: divide by the sample std (GRPO); off: mean-centred only (Dr. GRPO).
    A group of one, or with equal rewards, gives 0.
    """
    if not (len(rewards) == len(groups) == len(episodes)):
        raise ValueError(f"{len(rewards)} rewards, {len(groups)} groups, {len(episodes)} episodes")
    members: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out = [0.0] * len(rewards)
    zero_variance = 0
    for idx in members.values():
        if unit == "rollout":
            per_episode: dict[str, list[float]] = defaultdict(list)
            for i in idx:
                per_episode[episodes[i]].append(rewards[i])
            values = [mean_of(v) for v in per_episode.values()]
        else:
            values = [rewards[i] for i in idx]
        if len(values) < 2:
            continue
        if min(values) == max(values):  # exactly: fsum([0.1] * 3) / 3 is not 0.1
            zero_variance += 1
            continue
        mean = math.fsum(values) / len(values)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
        if std == 0.0:
            zero_variance += 1
            continue
        for i in idx:
            out[i] = (rewards[i] - mean) / (std + eps) if scale else rewards[i] - mean
    return out, zero_variance
