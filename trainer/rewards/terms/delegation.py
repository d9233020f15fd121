"""``delegation``: the planner is rewarded for assigning each task to an executor or tool that
can do it (the hierarchical decision "whether to delegate, and to whom")::

    per task the planner assigned = capable   if the assignee can do what the task requires
                                    incapable otherwise

Read from each task's latest ``schedule`` span that names a planner
(``agl_bridge.workflow.planner``): ``agl_bridge.workflow.task.assignee`` (what the plan assigned
the task to) and ``agl_bridge.workflow.task.requires`` (what the task needs, as the
orchestrator judges it). The assignee **can do it** when the capabilities recorded with the
schedule (``agl_bridge.workflow.capabilities``, JSON ``{assignee: [capability]}``) list the
requirement for it; an assignee they do not name (a tool assigned directly, or no capabilities
recorded) can do exactly what it is called. Scope: the planner, as an agent.

Schedule spans without a planner are a rule's decisions, not a plan's: ignored. A planner's
schedule without an assignee or a requirement is noted and not rewarded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc
from agl_bridge.trainer.rewards.terms.base import (
    EPISODE_KEY,
    NO_EVALUATIONS,
    Derived,
    Evaluations,
    RecipeReward,
    TableTerm,
)
from agl_bridge.trainer.rewards.terms.spans import attributes, named

NO_ASSIGNEE = "planned task without an assignee (not rewarded)"
NO_REQUIREMENT = "planned task without a requirement (not rewarded)"
BAD_CAPABILITIES = "capabilities that are not a JSON object of lists (ignored)"

TaskKey = tuple[str, str | None, str]  # episode, workflow id, task id


@dataclass(frozen=True)
class Schedule:
    """A task's latest schedule span, as the delegation and tool-choice terms read it."""

    planner: str | None
    assignee: str | None
    requires: str | None
    capabilities: Mapping[str, frozenset[str]]

    def can(self, who: str, requirement: str) -> bool:
        """Whether ``who`` (an executor or a tool) can do ``requirement``."""
        listed = self.capabilities.get(who)
        return requirement in listed if listed is not None else who == requirement


def _capabilities(raw: Any, term: str, out: Derived) -> dict[str, frozenset[str]]:
    if raw is None:
        return {}
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
            isinstance(v, list) and all(isinstance(c, str) for c in v) for v in parsed.values()):
        out.note(term, BAD_CAPABILITIES)
        return {}
    return {str(k): frozenset(v) for k, v in parsed.items()}


def read_schedules(spans: pa.Table, out: Derived, term: str) -> dict[TaskKey, Schedule]:
    """Each task's latest schedule span (by start time) with what a plan decided on it."""
    rows = named(spans, [sc.workflow_step_span_name("schedule")],
                 [EPISODE_KEY, "attributes", "span_id", "start_time_unix_nano"])
    if rows.num_rows == 0:
        return {}
    rows = rows.take(pc.sort_indices(rows, sort_keys=[
        ("start_time_unix_nano", "ascending"), ("span_id", "ascending")]))
    keys = [sc.WORKFLOW_ID, sc.WORKFLOW_TASK_ID, sc.WORKFLOW_PLANNER, sc.WORKFLOW_TASK_ASSIGNEE,
            sc.WORKFLOW_TASK_REQUIRES, sc.WORKFLOW_CAPABILITIES]
    found: dict[TaskKey, Schedule] = {}
    for episode, attrs in zip(rows[EPISODE_KEY].to_pylist(), attributes(rows, keys)):
        task_id, wf = attrs.get(sc.WORKFLOW_TASK_ID), attrs.get(sc.WORKFLOW_ID)
        if not isinstance(task_id, str) or not task_id:
            continue  # the dag term notes these
        text = {k: (v if isinstance(v, str) and v else None) for k, v in attrs.items()}
        found[(episode, wf if isinstance(wf, str) else None, task_id)] = Schedule(
            text.get(sc.WORKFLOW_PLANNER), text.get(sc.WORKFLOW_TASK_ASSIGNEE),
            text.get(sc.WORKFLOW_TASK_REQUIRES),
            _capabilities(attrs.get(sc.WORKFLOW_CAPABILITIES), term, out))
    return found


@dataclass(frozen=True)
class Delegation(TableTerm):
    capable: float = 0.5
    incapable: float = -0.5
    weight: float = 1.0
    name: str = "delegation"
    columns: tuple[str, ...] = ("name", "attributes", "span_id", "start_time_unix_nano")

    def __call__(self, spans: pa.Table, evaluations: Evaluations = NO_EVALUATIONS) -> Derived:
        out = Derived()
        for (episode, _, _), s in read_schedules(spans, out, self.name).items():
            if s.planner is None:
                continue
            if s.assignee is None:
                out.note(self.name, NO_ASSIGNEE)
                continue
            if s.requires is None:
                out.note(self.name, NO_REQUIREMENT)
                continue
            value = self.capable if s.can(s.assignee, s.requires) else self.incapable
            out.rewards.append(RecipeReward(episode, self.weight * value, sc.RewardScope.AGENT,
                                            s.planner, None, self.name))
        return out
