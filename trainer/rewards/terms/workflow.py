"""``workflow`` and ``global``: rewards for a whole DAG workflow run, the Flow design's scheme 1
(workflow structure RL: the planner's reward) and scheme 5 (the team's global reward)::

    workflow = alpha x success_rate + beta / (seconds + time_offset) - gamma x complexity
               (invalid instead, when the plan failed the orchestrator's checks)
    global   = success_weight x success_rate + efficiency_weight / (seconds + 1)
               - failure_penalty x failures

* a **workflow** is one workflow id of an episode, known from its ``agl_bridge.workflow`` span,
  its plan span or its task steps; its **tasks** are read as the ``dag`` term reads them
  (``dag.read_tasks``): success_rate = completed / total (0 with no task), failures = total -
  completed;
* **seconds**: the duration of the ``agl_bridge.workflow`` span; without one, from the first
  task step's start to the last one's end (noted);
* **complexity** (scheme 1's dependency complexity, lower is better): ``edges``, the
  dependency edges between the workflow's tasks; ``edges_per_task``; or ``depth``, the tasks on
  the longest dependency chain (edges inside a cycle are not followed);
* the **plan**: the workflow's latest ``agl_bridge.workflow.plan`` span, if any. Its planner
  (``agl_bridge.workflow.planner``; else the one named on the task's schedule spans) gets the
  ``workflow`` reward with ``to = "planner"``; with no planner known it goes to the team (noted).
  A plan marked invalid gets ``invalid`` instead of the formula: what ran, if anything, was not
  its plan.

The design's ``compute_reward`` writes efficiency as ``1 / (time + 1e-6)``: ``time_offset =
1e-6`` reproduces it (default 1, as scheme 5 writes it, so a run of a few milliseconds does not
dominate); its ``compute_global_reward`` scales the first two parts by 10 and 5, which
``success_weight = 10`` and ``efficiency_weight = 1.5`` reproduce.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc
from agl_bridge.trainer.rewards.terms.base import (
    EPISODE_KEY,
    NO_EVALUATIONS,
    Derived,
    Evaluations,
    Readers,
    RecipeError,
    RecipeReward,
    TableTerm,
    number,
    team_reward,
)
from agl_bridge.trainer.rewards.terms.dag import Task, TaskKey, read_tasks, strong_components
from agl_bridge.trainer.rewards.terms.spans import attributes, named

COMPLEXITY = ("edges", "edges_per_task", "depth")
RECIPIENTS = ("planner", "team")
COLUMNS = ("name", "attributes", "span_id", "start_time_unix_nano", "end_time_unix_nano",
           "agent_name")

NO_WORKFLOW_SPAN = "workflow without an agl_bridge.workflow span (time from its task steps)"
NO_TIME = "workflow without a start and an end (efficiency 0)"
NO_PLANNER = "workflow whose planner is not named (rewarded to the team)"
BAD_PLAN = "plan span without a boolean valid (counted as valid)"

WorkflowKey = tuple[str, str | None]  # episode, workflow id


@dataclass
class Run:
    """One workflow run as its spans tell it."""

    tasks: dict[str, Task] = field(default_factory=dict)
    span_ns: int | None = None  # duration of its agl_bridge.workflow span
    planner: str | None = None  # from the latest plan span, else a schedule span
    plan_valid: bool | None = None  # the latest plan span's verdict; None: no plan span

    @property
    def total(self) -> int:
        return len(self.tasks)

    @property
    def completed(self) -> int:
        return sum(1 for t in self.tasks.values() if t.passed)

    @property
    def success_rate(self) -> float:
        return self.completed / self.total if self.total else 0.0

    def seconds(self, term: str, out: Derived) -> float:
        if self.span_ns is not None:
            return self.span_ns / 1e9
        out.note(term, NO_WORKFLOW_SPAN)
        starts = [t.first_ns for t in self.tasks.values() if t.first_ns is not None]
        ends = [t.last_ns for t in self.tasks.values() if t.last_ns is not None]
        if not starts or not ends:
            out.note(term, NO_TIME)
            return float("inf")
        return max(max(ends) - min(starts), 0) / 1e9

    def edges(self) -> dict[str, list[str]]:
        """Dependency -> dependents, between this workflow's own tasks."""
        out: dict[str, list[str]] = {t: [] for t in self.tasks}
        for t, task in self.tasks.items():
            for d in sorted(task.depends_on):
                if d in out:
                    out[d].append(t)
        return out

    def complexity(self, kind: str) -> float:
        edges = self.edges()
        n_edges = sum(len(v) for v in edges.values())
        if kind == "edges":
            return float(n_edges)
        if kind == "edges_per_task":
            return n_edges / self.total if self.total else 0.0
        return float(_depth(edges))


def _depth(edges: Mapping[str, list[str]]) -> int:
    """Tasks on the longest dependency chain, edges inside a cycle left out."""
    component = strong_components(edges)
    acyclic = {d: [t for t in ts if component[t] != component[d]] for d, ts in edges.items()}
    indegree = {t: 0 for t in acyclic}
    for ts in acyclic.values():
        for t in ts:
            indegree[t] += 1
    level = {t: 1 for t in acyclic}
    ready = [t for t, n in indegree.items() if n == 0]
    while ready:
        d = ready.pop()
        for t in acyclic[d]:
            level[t] = max(level[t], level[d] + 1)
            indegree[t] -= 1
            if indegree[t] == 0:
                ready.append(t)
    return max(level.values(), default=0)


def read_runs(spans: pa.Table, out: Derived, term: str) -> dict[WorkflowKey, Run]:
    """Every workflow run of the unit: tasks, duration, planner and the plan's verdict."""
    runs: dict[WorkflowKey, Run] = defaultdict(Run)
    for (episode, wf, task_id), task in read_tasks(spans, out, term).items():
        runs[(episode, wf)].tasks[task_id] = task
    rows = named(spans, [sc.SPAN_WORKFLOW, sc.SPAN_WORKFLOW_PLAN, sc.workflow_step_span_name(
        "schedule")], [EPISODE_KEY, "name", "attributes", "span_id", "agent_name",
                       "start_time_unix_nano", "end_time_unix_nano"])
    if rows.num_rows:
        rows = rows.take(pc.sort_indices(rows, sort_keys=[
            ("start_time_unix_nano", "ascending"), ("span_id", "ascending")]))
    keys = [sc.WORKFLOW_ID, sc.WORKFLOW_PLANNER, sc.WORKFLOW_PLAN_VALID]
    schedulers: dict[WorkflowKey, str] = {}
    for row, attrs in zip(rows.select([EPISODE_KEY, "name", "agent_name",
                                       "start_time_unix_nano", "end_time_unix_nano"]
                                      ).to_pylist(), attributes(rows, keys)):
        wf = attrs.get(sc.WORKFLOW_ID)
        key = (row[EPISODE_KEY], wf if isinstance(wf, str) else None)
        planner = attrs.get(sc.WORKFLOW_PLANNER)
        planner = planner if isinstance(planner, str) and planner else None
        if row["name"] == sc.SPAN_WORKFLOW:
            start, end = row["start_time_unix_nano"], row["end_time_unix_nano"]
            if start is not None and end is not None:
                runs[key].span_ns = max(end - start, 0)
        elif row["name"] == sc.SPAN_WORKFLOW_PLAN:
            run = runs[key]
            run.planner = planner or row["agent_name"] or run.planner
            valid = attrs.get(sc.WORKFLOW_PLAN_VALID)
            if not isinstance(valid, bool):
                out.note(term, BAD_PLAN)
                valid = True
            run.plan_valid = valid
        elif planner is not None and key in runs:
            schedulers.setdefault(key, planner)
    for key, planner in schedulers.items():
        if runs[key].planner is None:
            runs[key].planner = planner
    return dict(runs)


def _positive(config: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = number(config, key, default, where)
    if value <= 0:
        raise RecipeError(f"{where}.{key}: expected a number > 0, got {value!r}")
    return value


@dataclass(frozen=True)
class WorkflowReward(TableTerm):
    """Scheme 1: the planner's reward for the workflow its plan made."""

    alpha: float = 1.0
    beta: float = 0.1
    gamma: float = 0.05
    complexity: str = "edges"
    time_offset: float = 1.0
    invalid: float = -1.0
    to: str = "planner"
    weight: float = 1.0
    name: str = "workflow"
    columns: tuple[str, ...] = COLUMNS
    readers: ClassVar[Readers] = {"complexity": COMPLEXITY, "to": RECIPIENTS,
                                  "time_offset": _positive}

    def value(self, run: Run, seconds: float) -> float:
        """The formula, or ``invalid`` for a plan that failed its checks."""
        if run.plan_valid is False:
            return self.invalid
        return (self.alpha * run.success_rate + self.beta / (seconds + self.time_offset)
                - self.gamma * run.complexity(self.complexity))

    def __call__(self, spans: pa.Table, evaluations: Evaluations = NO_EVALUATIONS) -> Derived:
        out = Derived()
        for (episode, _), run in read_runs(spans, out, self.name).items():
            value = self.weight * self.value(run, run.seconds(self.name, out))
            if self.to == "planner" and run.planner is not None:
                out.rewards.append(RecipeReward(episode, value, sc.RewardScope.AGENT,
                                                run.planner, None, self.name))
                continue
            if self.to == "planner":
                out.note(self.name, NO_PLANNER)
            out.rewards.append(team_reward(episode, value, self.name))
        return out


@dataclass(frozen=True)
class GlobalReward(TableTerm):
    """Scheme 5: the whole team's reward for a workflow run."""

    success_weight: float = 1.0
    efficiency_weight: float = 0.3
    failure_penalty: float = 0.5
    weight: float = 1.0
    name: str = "global"
    columns: tuple[str, ...] = COLUMNS

    def value(self, run: Run, seconds: float) -> float:
        return (self.success_weight * run.success_rate
                + self.efficiency_weight / (seconds + 1.0)
                - self.failure_penalty * (run.total - run.completed))

    def __call__(self, spans: pa.Table, evaluations: Evaluations = NO_EVALUATIONS) -> Derived:
        out = Derived()
        for (episode, _), run in read_runs(spans, out, self.name).items():
            out.rewards.append(team_reward(
                episode, self.weight * self.value(run, run.seconds(self.name, out)), self.name))
        return out


__all__ = ["GlobalReward", "Run", "TaskKey", "WorkflowReward", "read_runs"]
