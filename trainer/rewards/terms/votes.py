"""``votes``: a voter rewarded when it voted for the right answer (the MassGen design's
``compute_voting_reward``: +1 for a vote for the winner, -0.5 otherwise).

The right answer (``target``):

* ``"selected"``: the agent of the episode's final selection (the latest, if several);
* ``"best_rated"``: the agent whose answer was rated highest (``ratings.py``: by default the
  agent's own rewards and evaluations in the episode, or one evaluation such as a judge's),
  among the agents that put forward an answer (every rated agent when no answer span exists).
  A tie at the top, or no rating at all, leaves the episode's votes unrewarded.

Only the votes that count are rewarded (``ballots.py``: each voter's latest, unless a restart
withdrew it). A vote for an agent that never answered is simply not a vote for the right
answer: ``wrong``. The reward goes to the voter's turn in which it voted: the vote span's own
turn when it was recorded in the voter's scope, else the turn of the voter's latest LLM call
that ended at or before the vote (the call whose reply carried the vote: an orchestrator
records a vote after the reply, and MassGen starts the voter's next call before it records
the vote), a call without an end time counting at its start; else to the voter as an agent.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa

from agl_bridge.trainer.rewards.terms import ballots as bl
from agl_bridge.trainer.rewards.terms.base import (
    EPISODE_KEY,
    NO_EVALUATIONS,
    Derived,
    Evaluations,
    Readers,
    TableTerm,
    local_reward,
)
from agl_bridge.trainer.rewards.terms.ratings import (
    REWARD_COLUMNS,
    REWARDS,
    Source,
    agent_ratings,
    source,
)
from agl_bridge.trainer.rewards.terms.spans import chats

TARGETS = ("selected", "best_rated")

NO_SELECTION = "vote in an episode without a final selection (not rewarded)"
NO_RATING = "vote in an episode whose answers have no rating (not rewarded)"
TIE = "vote in an episode whose best rated answers tie (not rewarded)"
SUPERSEDED = "vote superseded by a later vote or withdrawn by a restart (not rewarded)"
SEVERAL_SELECTIONS = "episode with several final selections (the latest counts)"

# (end, turn) of each LLM call, by episode and agent, in end order
Calls = dict[tuple[str, str], list[tuple[int, int]]]


@dataclass(frozen=True)
class Votes(TableTerm):
    target: str = "selected"
    correct: float = 1.0
    wrong: float = -0.5
    rating: Source = REWARDS
    weight: float = 1.0
    name: str = "votes"
    columns: tuple[str, ...] = (*bl.COLUMNS, "operation_name", "end_time_unix_nano",
                                *REWARD_COLUMNS)
    readers: ClassVar[Readers] = {"target": TARGETS, "rating": source}

    def __call__(self, spans: pa.Table, evaluations: Evaluations = NO_EVALUATIONS) -> Derived:
        out = Derived()
        ballots = bl.read_ballots(spans)
        if not ballots:
            return out
        right = self._right_answers(spans, evaluations, ballots, out)
        calls = _calls(spans, {e for e, b in ballots.items() if b.votes})
        for episode, ballot in ballots.items():
            for why, n in ballot.notes.items():
                out.note(self.name, why, n)
            counted, superseded = ballot.counted_votes()
            out.note(self.name, SUPERSEDED, superseded)
            answer, why_not = right[episode]
            if answer is None:
                out.note(self.name, why_not, len(counted))
                continue
            for v in counted:
                value = self.correct if v.target == answer else self.wrong
                out.rewards.append(local_reward(episode, self.weight * value, v.voter,
                                                _turn(v, episode, calls), self.name))
        return out

    def _right_answers(self, spans: pa.Table, evaluations: Evaluations,
                       ballots: dict[str, bl.Ballot], out: Derived
                       ) -> dict[str, tuple[str | None, str]]:
        """Episode -> (the agent whose answer was right, or None and why not)."""
        right: dict[str, tuple[str | None, str]] = {}
        if self.target == "selected":
            for episode, b in ballots.items():
                out.note(self.name, SEVERAL_SELECTIONS, int(len(b.selections) > 1))
                right[episode] = (b.selected.agent, "") if b.selected else (None, NO_SELECTION)
            return right
        ratings = agent_ratings(spans, evaluations, self.rating, set(ballots))
        for episode, b in ballots.items():
            rated = ratings.get(episode, {})
            if b.answered:
                rated = {a: r for a, r in rated.items() if a in b.answered}
            if not rated:
                right[episode] = (None, NO_RATING)
                continue
            top = max(rated.values())
            best = [a for a, r in rated.items() if r == top]
            right[episode] = (best[0], "") if len(best) == 1 else (None, TIE)
        return right


def _calls(spans: pa.Table, episodes: set[str]) -> Calls:
    """The voters' LLM calls with a turn (``turn_index``, else the round, as the converter
    reads turns), by (episode, agent), in end order (the start where a call has no end)."""
    out: Calls = defaultdict(list)
    if not episodes:
        return out
    rows = chats(spans, [EPISODE_KEY, "agent_name", "start_time_unix_nano",
                         "end_time_unix_nano", "turn_index", "coordination_round"]).to_pylist()
    for r in rows:
        turn = r["turn_index"] if r["turn_index"] is not None else r["coordination_round"]
        end = r["end_time_unix_nano"] if r["end_time_unix_nano"] is not None \
            else r["start_time_unix_nano"]
        if r[EPISODE_KEY] in episodes and r["agent_name"] is not None and turn is not None and \
                end is not None:
            out[(r[EPISODE_KEY], r["agent_name"])].append((end, turn))
    for calls in out.values():
        calls.sort()
    return out


def _turn(v: bl.Vote, episode: str, calls: Calls) -> int | None:
    """The voter's turn in which it voted (None: unknown)."""
    if v.agent == v.voter and v.turn is not None:
        return v.turn
    own = calls.get((episode, v.voter))
    if not own or v.start is None:
        return None
    i = bisect.bisect_right(own, (v.start, float("inf"))) - 1
    return own[i][1] if i >= 0 else None
