"""Evaluations -> rewards: joined to their episode, de-duplicated, weighted.

An evaluation is a score that arrived after the fact (``agl_bridge.feedback``, an evaluation
tool's ``gen_ai.evaluation.result`` event, an LLM judge). It names what it scores in one of
these ways, tried in this order:

1. it was recorded inside the episode (its row carries the episode id; a span event of a span
   that carries one): that episode, and the agent and turn it was recorded in;
2. its target ``episode:E`` / ``trace:T`` / ``response:R`` (``any:X``: X as an episode id,
   else a trace id, else a response id): the episode; a response is one LLM call, so the score
   goes to that agent's turn. Without a target, its own ``gen_ai.response.id`` (how the GenAI
   conventions name the evaluated call when no span id is known) if a call has that id;
3. the span it is parented to (an OpenTelemetry event emitted inside the evaluated span; for a
   span event, the span holding it): that span's episode, agent and turn;
4. its own trace, when that trace holds exactly one episode.

The same evaluation recorded twice (same episode, agent and name) counts once: the latest wins
(by time, then id). ``weights`` says which evaluation names count and how much (None: every
name, weight 1); ``labels`` scores evaluations that carry only a label (``pass`` -> 1.0).
Pure: the converter gathers the records and the lookup tables (``conversion/evaluations.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from agl_bridge import semconv as sc

ANY = "any"
MAX_LISTED = 20


@dataclass(frozen=True)
class Evaluation:
    name: str
    score: float | None
    label: str | None
    time: int  # unix ns; the latest of duplicates wins
    ident: str  # breaks ties between equal times (span id)
    episode: str | None = None  # recorded inside the episode
    agent: str | None = None
    turn: int | None = None
    scope: str | None = None  # turn, agent, team, episode: as the record says
    kind: str | None = None
    target: str | None = None  # "kind:id"
    parent: tuple[str, str] | None = None  # (trace id, span id) of the evaluated span
    trace: str | None = None  # the record's own trace id
    response: str | None = None  # its gen_ai.response.id: the evaluated call


@dataclass(frozen=True)
class Place:
    """Where a span sits: its episode, agent and turn."""

    episode: str
    agent: str | None = None
    turn: int | None = None


@dataclass
class Lookup:
    """What the targets resolve against (filled only for the ids the evaluations name)."""

    episodes: set[str] = field(default_factory=set)
    traces: dict[str, set[str]] = field(default_factory=dict)  # trace id -> episode keys
    responses: dict[str, Place] = field(default_factory=dict)  # gen_ai.response.id -> call
    spans: dict[tuple[str, str], Place] = field(default_factory=dict)


@dataclass(frozen=True)
class EvaluationReward:
    episode: str
    value: float
    scope: str
    agent: str | None
    turn: int | None
    name: str
    kind: str | None


@dataclass
class Resolved:
    rewards: dict[str, list[EvaluationReward]] = field(default_factory=dict)
    notes: Counter[str] = field(default_factory=Counter)
    unknown: list[str] = field(default_factory=list)  # the first MAX_LISTED, by target


JOINED = "evaluation joined to its episode"
UNKNOWN = "evaluation for an unknown id (listed)"
AMBIGUOUS = "evaluation of a trace that holds several episodes (ignored)"
SUPERSEDED = "evaluation superseded by a later one with the same target and name"
NO_SCORE = "evaluation without a score or a known label (ignored)"
NOT_COUNTED = "evaluation whose name is not counted (weights)"


def _split(target: str) -> tuple[str, str]:
    kind, _, ident = target.partition(":")
    return (kind, ident) if ident else (ANY, target)


def _place(e: Evaluation, lookup: Lookup) -> tuple[Place | None, str | None]:
    """(where, why not): the first rule of the module docstring that applies."""
    if e.episode is not None:
        return Place(e.episode, e.agent, e.turn), None
    if e.target:
        kind, ident = _split(e.target)
        if kind in (ANY, sc.TARGET_EPISODE) and ident in lookup.episodes:
            return Place(ident, e.agent), None
        if kind in (ANY, sc.TARGET_TRACE):
            episodes = lookup.traces.get(ident.lower())
            if episodes:
                if len(episodes) > 1:
                    return None, AMBIGUOUS
                return Place(next(iter(episodes)), e.agent), None
        if kind in (ANY, sc.TARGET_RESPONSE) and ident in lookup.responses:
            p = lookup.responses[ident]
            return Place(p.episode, e.agent or p.agent, p.turn if not e.agent or
                         e.agent == p.agent else None), None
        return None, UNKNOWN
    if e.response is not None and e.response in lookup.responses:
        return lookup.responses[e.response], None
    if e.parent is not None and e.parent in lookup.spans:
        return lookup.spans[e.parent], None
    if e.trace is not None:
        episodes = lookup.traces.get(e.trace, set())
        if len(episodes) == 1:
            return Place(next(iter(episodes))), None
        if len(episodes) > 1:
            return None, AMBIGUOUS
    return None, UNKNOWN


def _scope(e: Evaluation, place: Place) -> str:
    if e.scope in sc.RewardScope.ALL:
        scope = e.scope
        if scope == sc.RewardScope.AGENT and place.agent is None:
            return sc.RewardScope.EPISODE
        if scope == sc.RewardScope.TURN and (place.agent is None or place.turn is None):
            return sc.RewardScope.AGENT if place.agent is not None else sc.RewardScope.EPISODE
        return scope
    if place.agent is not None and place.turn is not None:
        return sc.RewardScope.TURN
    return sc.RewardScope.AGENT if place.agent is not None else sc.RewardScope.EPISODE


def resolve(evaluations: list[Evaluation], lookup: Lookup, *,
            weights: Mapping[str, float] | None = None,
            labels: Mapping[str, float] | None = None) -> Resolved:
    out = Resolved()
    latest: dict[tuple[str, str | None, int | None, str], tuple[tuple[int, str], Evaluation,
                                                               Place, float]] = {}
    for e in evaluations:
        weight = 1.0 if weights is None else weights.get(e.name)
        if weight is None or weight == 0.0:
            out.notes[NOT_COUNTED] += 1
            continue
        score = e.score
        if score is None and e.label is not None and labels is not None:
            score = labels.get(e.label)
        if score is None:
            out.notes[NO_SCORE] += 1
            continue
        place, why = _place(e, lookup)
        if place is None:
            out.notes[why or UNKNOWN] += 1
            if why == UNKNOWN and len(out.unknown) < MAX_LISTED:
                named = e.target or (f"{sc.TARGET_RESPONSE}:{e.response}" if e.response
                                     else None) or e.parent or e.trace
                out.unknown.append(f"{e.name}: {named}")
            continue
        scope = _scope(e, place)
        key = (place.episode, place.agent if scope != sc.RewardScope.EPISODE else None,
               place.turn if scope == sc.RewardScope.TURN else None, e.name)
        order = (e.time, e.ident)
        if key in latest:
            out.notes[SUPERSEDED] += 1
            if latest[key][0] >= order:
                continue
        latest[key] = (order, e, place, score * weight)
    for (episode, agent, turn, name), (_, e, place, value) in latest.items():
        scope = _scope(e, place)
        out.rewards.setdefault(episode, []).append(
            EvaluationReward(episode, value, scope, agent, turn, name, e.kind))
        out.notes[JOINED] += 1
    return out
