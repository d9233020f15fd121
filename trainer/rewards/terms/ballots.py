"""The coordination of a voting orchestrator (MassGen-style), episode by episode, as its spans
tell it: answers, votes, restarts, the final selection, and how many rounds it took.

Which votes count is MassGen's rule: an agent's vote is its *current* one. A later vote by the
same agent replaces it, and a restart of the agent (another agent's new answer made it start
over) withdraws it until it votes again, which is why MassGen's ``vote_results`` leave out
superseded votes. So of each voter's votes only the latest counts, and only if no restart of
that voter came after it. Order is by start time, then span id.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc
from agl_bridge.trainer.rewards.terms.base import EPISODE_KEY
from agl_bridge.trainer.rewards.terms.spans import attributes, named

COORDINATION_SPANS = (sc.SPAN_VOTE, sc.SPAN_RESTART, sc.SPAN_FINAL_SELECTION, sc.SPAN_NEW_ANSWER,
                      sc.SPAN_ROUND)
COLUMNS = ("name", "attributes", "span_id", "start_time_unix_nano", "agent_name", "turn_index",
           "coordination_round")

VOTE_WITHOUT_PARTIES = "vote span without voter or target (ignored)"
SELECTION_WITHOUT_AGENT = "final selection span without an agent (ignored)"
BAD_COUNTS = "final selection with unreadable vote counts (votes counted from vote spans)"


@dataclass(frozen=True)
class Vote:
    voter: str
    target: str
    order: int  # position in the episode's coordination spans, by (start, span id)
    start: int | None
    agent: str | None  # the vote span's own agent and turn columns (its scope when recorded)
    turn: int | None


@dataclass(frozen=True)
class Selection:
    agent: str
    order: int
    counts: dict[str, int] | None  # the orchestrator's tallies, when it recorded them


@dataclass
class Ballot:
    """One episode's coordination."""

    votes: list[Vote] = field(default_factory=list)  # every vote, in order
    restarts: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    selections: list[Selection] = field(default_factory=list)  # in order
    answered: set[str] = field(default_factory=set)  # agents that put forward an answer
    rounds: int = 0  # highest coordination round on any of the episode's spans, + 1
    notes: Counter[str] = field(default_factory=Counter)  # malformed spans, by why

    @property
    def selected(self) -> Selection | None:
        """The final selection: the latest one if the orchestrator recorded several."""
        return self.selections[-1] if self.selections else None

    def counted_votes(self) -> tuple[list[Vote], int]:
        """(the votes that count, how many were superseded or withdrawn): each voter's
        latest vote, unless a restart of that voter came after it."""
        latest: dict[str, Vote] = {}
        for v in self.votes:
            latest[v.voter] = v
        counted = [v for v in latest.values()
                   if not any(r > v.order for r in self.restarts.get(v.voter, ()))]
        return sorted(counted, key=lambda v: v.order), len(self.votes) - len(counted)

    def tally(self) -> dict[str, int]:
        """Votes per target: the final selection's own counts when it has them (what the
        orchestrator decided on), else the counted votes."""
        selected = self.selected
        if selected is not None and selected.counts is not None:
            return dict(selected.counts)
        return dict(Counter(v.target for v in self.counted_votes()[0]))


def read_ballots(spans: pa.Table) -> dict[str, Ballot]:
    """Episode key -> its coordination, for the episodes that have coordination spans."""
    rows = named(spans, COORDINATION_SPANS, [EPISODE_KEY, "name", "attributes", "span_id",
                                             "start_time_unix_nano", "agent_name",
                                             "turn_index"])
    if rows.num_rows == 0:
        return {}
    order = pc.sort_indices(rows, sort_keys=[(EPISODE_KEY, "ascending"),
                                             ("start_time_unix_nano", "ascending"),
                                             ("span_id", "ascending")])
    rows = rows.take(order)
    keys = [sc.VOTE_VOTER, sc.VOTE_TARGET, sc.COORDINATION_AGENT, sc.VOTE_COUNTS]
    ballots: dict[str, Ballot] = defaultdict(Ballot)
    for i, (row, attrs) in enumerate(zip(
            rows.select([EPISODE_KEY, "name", "start_time_unix_nano", "agent_name",
                         "turn_index"]).to_pylist(), attributes(rows, keys))):
        b = ballots[row[EPISODE_KEY]]
        name, agent = row["name"], _text(attrs.get(sc.COORDINATION_AGENT))
        if name == sc.SPAN_VOTE:
            voter, target = _text(attrs.get(sc.VOTE_VOTER)), _text(attrs.get(sc.VOTE_TARGET))
            if voter is None or target is None:
                b.notes[VOTE_WITHOUT_PARTIES] += 1
                continue
            b.votes.append(Vote(voter, target, i, row["start_time_unix_nano"],
                                row["agent_name"], row["turn_index"]))
        elif name == sc.SPAN_RESTART and agent is not None:
            b.restarts[agent].append(i)
        elif name == sc.SPAN_NEW_ANSWER and agent is not None:
            b.answered.add(agent)
        elif name == sc.SPAN_FINAL_SELECTION:
            if agent is None:
                b.notes[SELECTION_WITHOUT_AGENT] += 1
                continue
            counts = _counts(attrs.get(sc.VOTE_COUNTS))
            if counts is None and sc.VOTE_COUNTS in attrs:
                b.notes[BAD_COUNTS] += 1
            b.selections.append(Selection(agent, i, counts))
    _rounds(spans, ballots)
    return dict(ballots)


def _rounds(spans: pa.Table, ballots: dict[str, Ballot]) -> None:
    """Rounds = the highest 0-based coordination round any span of the episode carries, + 1."""
    has = pc.and_(pc.is_valid(spans["coordination_round"]),
                  pc.is_in(spans[EPISODE_KEY], value_set=pa.array(list(ballots), pa.string())))
    rows = spans.select([EPISODE_KEY, "coordination_round"]).filter(has)
    episodes = rows[EPISODE_KEY].to_pylist()
    rounds = np.asarray(rows["coordination_round"].to_numpy(zero_copy_only=False))
    for episode, r in zip(episodes, rounds):
        if episode in ballots:
            b = ballots[episode]
            b.rounds = max(b.rounds, int(r) + 1)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _counts(raw: object) -> dict[str, int] | None:
    """``agl_bridge.vote.counts``: a JSON object of agent -> votes."""
    try:
        counts = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    if not isinstance(counts, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in counts.items()):
        return None
    return counts
