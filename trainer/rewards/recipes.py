"""Reward recipes: rewards derived at conversion from what the spans already hold.

Production traces rarely carry a reward, but they hold evidence: a tool call failed, a vote
picked the answer that won, a DAG task was retried. A recipe (a TOML file) names the terms to
derive and their constants; conversion applies it to each episode's spans, so stored traces
can be rewarded again with a new recipe without running the agents again::

    [evaluations]            # which evaluations count as rewards (feedback, judges): weights
    feedback = 1.0
    [evaluations.labels]     # scores for label-only evaluations
    pass = 1.0

    [terms.tool_failure]     # an execute_tool span that failed: a penalty to the calling agent
    penalty = -0.2

Every term takes ``weight`` (default 1) besides its own constants. A term is a pure function
of one unit's span rows (an Arrow table with the columns it declares, plus ``episode_key``) to
rewards with a scope; the converter adds them to the episode's other rewards (sum) and the
convert summary reports what each term contributed, per agent.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc

EPISODE_KEY = "episode_key"  # the column the converter adds: each row's episode key


class RecipeError(ValueError):
    """A recipe that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class RecipeReward:
    episode: str
    value: float
    scope: str  # turn, agent, team, episode
    agent: str | None
    turn: int | None
    term: str


class Term(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def columns(self) -> tuple[str, ...]:  # span columns the term reads
        ...

    def __call__(self, spans: pa.Table) -> list[RecipeReward]: ...


def _number(config: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(float(value)):
        raise RecipeError(f"{where}.{key}: expected a finite number, got {value!r}")
    return float(value)


def _check_keys(config: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(config) - allowed - {"weight"})
    if unknown:
        known = sorted(allowed | {"weight"})
        raise RecipeError(f"{where}: unknown key(s) {unknown}; known: {known}")


@dataclass(frozen=True)
class ToolFailure:
    """An ``execute_tool`` span that ended in error: ``penalty`` to the agent that called the
    tool (its turn when the span has one); a successful one: ``success`` (default 0)."""

    penalty: float = -0.2
    success: float = 0.0
    weight: float = 1.0
    name: str = "tool_failure"
    columns: tuple[str, ...] = ("operation_name", "status_code", "agent_name", "turn_index")

    @classmethod
    def from_config(cls, config: Mapping[str, Any], where: str) -> ToolFailure:
        _check_keys(config, {"penalty", "success"}, where)
        return cls(_number(config, "penalty", -0.2, where), _number(config, "success", 0.0, where),
                   _number(config, "weight", 1.0, where))

    def __call__(self, spans: pa.Table) -> list[RecipeReward]:
        tools = spans.filter(pc.fill_null(pc.equal(spans["operation_name"], sc.OP_EXECUTE_TOOL),
                                          False))
        out = []
        for row in tools.select([EPISODE_KEY, "status_code", "agent_name", "turn_index"]
                                ).to_pylist():
            value = self.penalty if row["status_code"] == "ERROR" else self.success
            if value == 0.0:
                continue
            agent, turn = row["agent_name"], row["turn_index"]
            scope = (sc.RewardScope.TURN if agent is not None and turn is not None else
                     sc.RewardScope.AGENT if agent is not None else sc.RewardScope.EPISODE)
            out.append(RecipeReward(row[EPISODE_KEY], self.weight * value, scope, agent,
                                    turn if scope == sc.RewardScope.TURN else None, self.name))
        return out


# term name in the TOML -> how to build it from its table
TERMS: dict[str, Callable[[Mapping[str, Any], str], Term]] = {
    "tool_failure": ToolFailure.from_config,
}


@dataclass(frozen=True)
class Recipe:
    terms: tuple[Term, ...] = ()
    evaluation_weights: Mapping[str, float] | None = None
    evaluation_labels: Mapping[str, float] | None = None
    source: str = ""  # where it was read from, for messages
    config: Mapping[str, Any] = field(default_factory=dict)  # as read, for run records

    @property
    def columns(self) -> tuple[str, ...]:
        """The span columns the terms read (the converter reads them too)."""
        seen: dict[str, None] = {}
        for t in self.terms:
            seen.update(dict.fromkeys(t.columns))
        return tuple(seen)

    def apply(self, spans: pa.Table) -> list[RecipeReward]:
        """Every term's rewards for the span rows of one unit (with ``episode_key``)."""
        out: list[RecipeReward] = []
        for term in self.terms:
            out += term(spans)
        return out


def _weights(table: Any, where: str) -> dict[str, float]:
    if not isinstance(table, Mapping):
        raise RecipeError(f"{where}: expected a table of name = number")
    return {str(k): _number(table, k, 0.0, where) for k in table}


def recipe_from_dict(config: Mapping[str, Any], source: str = "<recipe>") -> Recipe:
    """A recipe from its parsed TOML; every problem names ``source`` and the key."""
    unknown = sorted(set(config) - {"evaluations", "terms"})
    if unknown:
        raise RecipeError(f"{source}: unknown section(s) {unknown}; known: evaluations, terms")
    weights = labels = None
    evaluations = config.get("evaluations")
    if evaluations is not None:
        if not isinstance(evaluations, Mapping):
            raise RecipeError(f"{source}: [evaluations] must be a table")
        evaluations = dict(evaluations)
        raw_labels = evaluations.pop("labels", None)
        weights = _weights(evaluations, f"{source}: [evaluations]") if evaluations else None
        labels = _weights(raw_labels, f"{source}: [evaluations.labels]") \
            if raw_labels is not None else None
    terms: list[Term] = []
    raw_terms = config.get("terms", {})
    if not isinstance(raw_terms, Mapping):
        raise RecipeError(f"{source}: [terms] must be a table of terms")
    for name, term_config in raw_terms.items():
        where = f"{source}: [terms.{name}]"
        if name not in TERMS:
            raise RecipeError(f"{where}: unknown term; known: {sorted(TERMS)}")
        if not isinstance(term_config, Mapping):
            raise RecipeError(f"{where}: must be a table")
        terms.append(TERMS[name](term_config, where))
    return Recipe(tuple(terms), weights, labels, source, dict(config))


def load_recipe(path: str | os.PathLike[str]) -> Recipe:
    """Read a recipe TOML file (see the module docstring)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    p = Path(path)
    try:
        config = tomllib.loads(p.read_text())
    except OSError as exc:
        raise RecipeError(f"{p}: cannot read the recipe ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{p}: not valid TOML ({exc})") from None
    return recipe_from_dict(config, str(p))
