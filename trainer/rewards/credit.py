"""Credit assignment and grouping: per-transition rewards and group ids from arrays.

Three algorithms, as in the design documents:

* LightningRL (Agent Lightning): identical assignment. Every transition of an episode gets the
  episode's reward (the sum of its episode- and team-scoped rewards); groups are tasks.
* AT-GRPO (PettingLLMs): agent- and turn-wise. A transition's reward mixes the team's reward with
  its own: ``r = alpha * team + local``, where ``local`` is the sum of the rewards scoped to its
  agent and to its agent-turn. Groups are ``(task, agent, turn)``, so the K candidates sampled for
  one agent-turn (tree sampling) are compared with each other and never with another task's.
* PPO (verl's multi-turn PPO with ``adv_estimator: gae``): each reward sits at the end of the
  turn it belongs to, for the critic's GAE to carry back over the agent's turns
  (``trainer/training/gae.py``): a transition's reward is its own turn's rewards, and on the
  agent's last turn in the episode also ``alpha * team`` and the rewards scoped to the agent.
  Summed over an agent's turns this is AT-GRPO's reward of one turn; nothing is counted twice.
  Groups as AT-GRPO's (they only matter to filters and statistics: the critic is the baseline).

``gamma`` discounts the team reward over an agent's turns: turn t of an agent whose last turn in
the episode is T gets ``gamma ** (T - t)`` of it (1.0: no discount). Under PPO the conversion
does not discount: GAE does, per generated token.

Pure functions of numpy and Arrow arrays: the converter (``agl_bridge.trainer.conversion``)
gathers the inputs, these compute the numbers.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Algorithm = Literal["at_grpo", "lightning_rl", "ppo"]
AdvantageUnit = Literal["transition", "rollout"]


def discounted(team: np.ndarray, turn: np.ndarray, turn_valid: np.ndarray,
               agent_episode: np.ndarray, gamma: float) -> np.ndarray:
    """``team * gamma ** (T - t)`` per transition, T the last turn of its (episode, agent)
    (``agent_episode``: a dense code per pair); transitions without a turn keep ``team``."""
    if gamma == 1.0 or len(team) == 0:
        return team
    low = np.iinfo(np.int64).min
    last = np.full(int(agent_episode.max()) + 1, low, np.int64)
    np.maximum.at(last, agent_episode[turn_valid], turn[turn_valid])
    last_t = last[agent_episode]
    has = turn_valid & (last_t != low)
    exps = np.where(has, last_t - turn, 0)
    uniq, inv = np.unique(exps, return_inverse=True)
    factor = np.array([gamma ** int(e) for e in uniq], np.float64)[inv.reshape(-1)]
    return team * np.where(has, factor, 1.0)


def last_turns(turn: np.ndarray, turn_valid: np.ndarray, agent_episode: np.ndarray
               ) -> np.ndarray:
    """Whether each transition is on its agent's last turn in the episode (``agent_episode``: a
    dense code per pair; every candidate of that turn is). A transition without a turn counts
    as last: where it sits in the agent's turns is unknown, and its rewards must land somewhere."""
    if len(turn) == 0:
        return np.zeros(0, bool)
    low = np.iinfo(np.int64).min
    last = np.full(int(agent_episode.max()) + 1, low, np.int64)
    np.maximum.at(last, agent_episode[turn_valid], turn[turn_valid])
    return ~turn_valid | (turn == last[agent_episode])


def transition_rewards(team: np.ndarray, local: np.ndarray, *, algorithm: Algorithm,
                       alpha: float = 1.0) -> np.ndarray:
    """LightningRL: the team reward; AT-GRPO and PPO: ``alpha * team + local`` (PPO's ``team``
    and ``local`` already placed by turn: ``last_turns``)."""
    if algorithm == "lightning_rl":
        return team
    return alpha * team + local
