"""What every recipe term shares: the reward it derives, its output, its contract, and the
checks of its TOML table.

A term is a pure function of one conversion unit's span rows (an Arrow table with the columns
the term declares, plus ``episode_key``: every episode of the unit lies wholly in it) and of
the evaluations joined to those episodes, to rewards with a scope. It never sees another
unit, so terms run wherever the converter streams, spills or converts in memory, and the same
stored traces can be rewarded again with another recipe.

A term reports what it could not use (a vote without a final selection, a dependency on an
unknown task) as notes, counted in the convert summary: never an exception on bad spans.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, TypeVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc
from agl_bridge.trainer.arrow import lit
from agl_bridge.trainer.rewards.evaluations import EvaluationReward

EPISODE_KEY = "episode_key"  # the column the converter adds: each row's episode key

# episode key -> the evaluations joined to it (feedback, judges), as the converter resolved them
Evaluations = Mapping[str, Sequence[EvaluationReward]]
NO_EVALUATIONS: Evaluations = {}

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")
TT = TypeVar("TT", bound="TableTerm")
# reads one key of a term's table: (table, key, default, where) -> value
Reader = Callable[[Mapping[str, Any], str, Any, str], Any]
# a term's keys read otherwise than as a count or a number (``from_table``'s ``special``)
Readers = Mapping[str, "Iterable[str] | Reader"]


class RecipeError(ValueError):
    """A recipe that cannot be used; the message names the file and the key."""


class RecipeReward(NamedTuple):
    """One derived reward (a tuple: a per-call term makes hundreds of thousands of them)."""

    episode: str
    value: float
    scope: str  # turn, agent, team, episode
    agent: str | None
    turn: int | None
    term: str


@dataclass
class Derived:
    """What terms derived from one unit: rewards, and counted notes on what they left out
    (the convert summary prints the notes; each starts with ``recipe <term>:``)."""

    rewards: list[RecipeReward] = field(default_factory=list)
    notes: Counter[str] = field(default_factory=Counter)

    def __iadd__(self, other: Derived) -> Derived:
        self.rewards += other.rewards
        self.notes.update(other.notes)
        return self

    def note(self, term: str, why: str, n: int = 1) -> None:
        if n:
            self.notes[f"recipe {term}: {why}"] += n


class Term(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def columns(self) -> tuple[str, ...]:  # span columns the term reads
        ...

    def __call__(self, spans: pa.Table, evaluations: Evaluations = NO_EVALUATIONS) -> Derived:
        ...


# -- the TOML table of a term -------------------------------------------------------------------
def number(config: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(float(value)):
        raise RecipeError(f"{where}.{key}: expected a finite number, got {value!r}")
    return float(value)


def count(config: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RecipeError(f"{where}.{key}: expected an integer >= 0, got {value!r}")
    return value


def choice(config: Mapping[str, Any], key: str, default: str, allowed: Iterable[str],
           where: str) -> str:
    value = config.get(key, default)
    allowed = tuple(allowed)
    if value not in allowed:
        raise RecipeError(f"{where}.{key}: expected one of {list(allowed)}, got {value!r}")
    return str(value)


def check_keys(config: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(config) - allowed - {"weight"})
    if unknown:
        known = sorted(allowed | {"weight"})
        raise RecipeError(f"{where}: unknown key(s) {unknown}; known: {known}")


def from_table(cls: type[T], config: Mapping[str, Any], where: str,
               **special: Iterable[str] | Reader) -> T:
    """A term from its TOML table: each of its constants (the dataclass fields but ``name`` and
    ``columns``) as given, else the field's default, so a default is written once. An ``int``
    field is a count, a ``float`` one a finite number; ``special`` names the others: the values
    a string may take, or a function that reads the value (a ``ratings.Source``)."""
    fields = [f for f in dataclasses.fields(cls) if f.name not in ("name", "columns")]
    check_keys(config, {f.name for f in fields}, where)
    values: dict[str, Any] = {}
    for f in fields:
        how, default = special.get(f.name), cast(Any, f.default)
        if callable(how):
            values[f.name] = how(config, f.name, default, where)
        elif how is not None:
            values[f.name] = choice(config, f.name, default, how, where)
        elif isinstance(default, int):
            values[f.name] = count(config, f.name, default, where)
        else:
            values[f.name] = number(config, f.name, default, where)
    return cls(**values)


class TableTerm:
    """A term (a frozen dataclass) built from its TOML table: ``from_table`` with the term's
    ``readers``."""

    readers: ClassVar[Readers] = {}

    @classmethod
    def from_config(cls: type[TT], config: Mapping[str, Any], where: str) -> TT:
        return cast(TT, from_table(cast(Any, cls), config, where, **cls.readers))


# -- where a reward goes ------------------------------------------------------------------------
def local_reward(episode: str, value: float, agent: str | None, turn: int | None,
                 term: str) -> RecipeReward:
    """A reward for ``agent``'s ``turn`` when both are known, else for the agent, else for the
    whole episode: the narrowest scope the spans support."""
    if agent is not None and turn is not None:
        return RecipeReward(episode, value, sc.RewardScope.TURN, agent, turn, term)
    if agent is not None:
        return RecipeReward(episode, value, sc.RewardScope.AGENT, agent, None, term)
    return RecipeReward(episode, value, sc.RewardScope.EPISODE, None, None, term)


def local_rewards(episodes: pa.Array, values: np.ndarray, agents: pa.Array, turns: pa.Array,
                  term: str) -> list[RecipeReward]:
    """``local_reward`` for many rows at once (a per-call term), leaving out zero values: the
    scopes are worked out on columns, so the only per-row work is making the tuple."""
    keep = values != 0.0
    if not keep.any():
        return []
    mask = pa.array(keep)
    agents, turns, episodes = agents.filter(mask), turns.filter(mask), episodes.filter(mask)
    has_agent = pc.is_valid(agents)
    has_turn = pc.and_(has_agent, pc.is_valid(turns))
    scopes = pc.if_else(has_turn, lit(sc.RewardScope.TURN), pc.if_else(
        has_agent, lit(sc.RewardScope.AGENT), lit(sc.RewardScope.EPISODE)))
    turns = pc.if_else(has_turn, turns, pa.nulls(1, turns.type)[0])
    return list(map(RecipeReward._make, zip(
        episodes.to_pylist(), values[keep].tolist(), scopes.to_pylist(), agents.to_pylist(),
        turns.to_pylist(), repeat(term))))


def team_reward(episode: str, value: float, term: str) -> RecipeReward:
    return RecipeReward(episode, value, sc.RewardScope.TEAM, None, None, term)
