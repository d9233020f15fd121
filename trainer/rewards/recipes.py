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
    [terms.votes]            # +1 for a vote for the selected answer, -0.5 otherwise
    target = "selected"

Every term takes ``weight`` (default 1) besides its own constants. A term is a pure function
of one unit's span rows (an Arrow table with the columns it declares, plus ``episode_key``) to
rewards with a scope; the converter adds them to the episode's other rewards (sum) and the
convert summary reports what each term contributed, per agent. The terms (``terms/``):
``tool_failure``, ``votes``, ``coordination``, ``dag``, ``cost``, ``workflow``, ``global``,
``delegation``, ``tool_choice``; docs/recipes.md describes
each, with its constants and a worked example.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from agl_bridge.trainer.rewards.terms import (
    Coordination,
    Cost,
    Dag,
    Delegation,
    GlobalReward,
    ToolChoice,
    ToolFailure,
    Votes,
    WorkflowReward,
)
from agl_bridge.trainer.rewards.terms.base import (
    EPISODE_KEY,
    NO_EVALUATIONS,
    Derived,
    Evaluations,
    RecipeError,
    RecipeReward,
    Term,
    number,
)

# term name in the TOML -> how to build it from its table
TERMS: dict[str, Callable[[Mapping[str, Any], str], Term]] = {
    "tool_failure": ToolFailure.from_config,
    "votes": Votes.from_config,
    "coordination": Coordination.from_config,
    "dag": Dag.from_config,
    "cost": Cost.from_config,
    "workflow": WorkflowReward.from_config,
    "global": GlobalReward.from_config,
    "delegation": Delegation.from_config,
    "tool_choice": ToolChoice.from_config,
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

    def apply(self, spans: pa.Table, evaluations: Evaluations | None = None) -> Derived:
        """Every term's rewards (and notes) for the span rows of one unit (with
        ``episode_key``); ``evaluations``: those joined to the unit's episodes, by key."""
        out = Derived()
        for term in self.terms:
            out += term(spans, evaluations or NO_EVALUATIONS)
        return out


def _weights(table: Any, where: str) -> dict[str, float]:
    if not isinstance(table, Mapping):
        raise RecipeError(f"{where}: expected a table of name = number")
    return {str(k): number(table, k, 0.0, where) for k in table}


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
    from agl_bridge.settings import SettingError, loads, read_text

    p = Path(path)
    try:
        config = loads(read_text(p, "recipe"), f"recipe {p}")
    except SettingError as exc:
        raise RecipeError(str(exc)) from None
    return recipe_from_dict(config, str(p))


__all__ = ["EPISODE_KEY", "TERMS", "Derived", "Recipe", "RecipeError", "RecipeReward", "Term",
           "load_recipe", "recipe_from_dict"]
