"""``dag``: rewards per task of a DAG workflow and for the workflow (the Flow design's
``RewardCalculator``), from the ``agl_bridge.workflow.task.{schedule,execute,validate,retry}``
spans alone::

    task reward     = (success if the task succeeded else failure)
                    + retry x retries
                    + downstream x (direct dependents that succeeded)
                    + efficiency / (execution seconds + 1)          (0 unless set)
    workflow reward = workflow x completed / total                  (scope team)

* a task is one task id in one workflow of an episode; it **succeeded** when its last
  validation (``agl_bridge.workflow.validation.passed``) passed. A task never validated counts
  as failed (noted);
* **retries**: the number of its ``retry`` spans, or its highest ``attempt`` (0-based) on any
  step if that is more;
* **dependents** of task D: the tasks whose ``depends_on`` names D. A dependency on a task with
  no spans in the workflow is noted and ignored; a dependency that closes a cycle (a task on
  itself included) is noted and gives no bonus;
* **execution seconds**: the summed durations of its execute and retry spans;
* the task reward goes to its **executor**: the agent of its last execute or retry span (else of
  a validate, else of the schedule span), scope ``agent``; with ``scope = "turn"``, to the turn of
  the executor's LLM calls inside its last attempt (their parent span), per agent if there are
  none. A task without an agent is noted and not rewarded; it still counts in the workflow's
  completion.
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
    RecipeReward,
    TableTerm,
    local_reward,
    team_reward,
)
from agl_bridge.trainer.rewards.terms.spans import attributes, chats, named

STEPS = {sc.workflow_step_span_name(s): s for s in sc.WORKFLOW_STEPS}
SCOPES = (sc.RewardScope.AGENT, sc.RewardScope.TURN)

NO_TASK_ID = "workflow step without a task id (ignored)"
NO_VERDICT = "validate span without a verdict (ignored)"
NEVER_VALIDATED = "task never validated (counted as failed)"
UNKNOWN_DEPENDENCY = "dependency on a task with no spans in its workflow (ignored)"
CYCLE = "dependency that closes a cycle (no downstream bonus)"
BAD_DEPENDS_ON = "depends_on that is not a list of task ids (ignored)"
NO_AGENT = "task without an agent (not rewarded; counted in its workflow)"
NO_TURN = "task whose last attempt has no LLM call with a turn (rewarded per agent)"

TaskKey = tuple[str, str | None, str]  # episode, workflow id, task id


@dataclass
class Task:
    """One task as its step spans tell it."""

    executor: str | None = None  # agent of the last execute/retry span
    other_agent: str | None = None  # of a validate or schedule span, if no executor
    passed: bool | None = None  # the last validation's verdict
    retry_spans: int = 0
    max_attempt: int = 0
    depends_on: set[str] = field(default_factory=set)
    execution_ns: int = 0
    last_attempt: str | None = None  # span id of the last execute/retry span
    first_ns: int | None = None  # the earliest start of its step spans
    last_ns: int | None = None  # the latest end

    @property
    def agent(self) -> str | None:
        return self.executor or self.other_agent

    @property
    def retries(self) -> int:
        return max(self.retry_spans, self.max_attempt)


@dataclass(frozen=True)
class Dag(TableTerm):
    success: float = 1.0
    failure: float = -0.5
    retry: float = -0.1
    downstream: float = 0.5
    efficiency: float = 0.0
    workflow: float = 1.0
    scope: str = sc.RewardScope.AGENT
    weight: float = 1.0
    name: str = "dag"

    @property
    def columns(self) -> tuple[str, ...]:
        """What it reads; the parent span ids (a long unique string per span) only for turn
        scope, which finds the calls inside each task's last attempt by them."""
        return ("name", "attributes", "span_id", "start_time_unix_nano", "end_time_unix_nano",
                "agent_name", "turn_index", "operation_name") + (
            ("parent_span_id",) if self.scope == sc.RewardScope.TURN else ())
    readers: ClassVar[Readers] = {"scope": SCOPES}

    def __call__(self, spans: pa.Table, evaluations: Evaluations = NO_EVALUATIONS) -> Derived:
        out = Derived()
        tasks = self._tasks(spans, out)
        if not tasks:
            return out
        turns = _attempt_turns(spans, tasks) if self.scope == sc.RewardScope.TURN else {}
        workflows: dict[tuple[str, str | None], list[str]] = defaultdict(list)
        for episode, wf, task_id in tasks:
            workflows[(episode, wf)].append(task_id)
        for (episode, wf), ids in workflows.items():
            done = {t for t in ids if tasks[(episode, wf, t)].passed}
            bonus = self._dependents(episode, wf, ids, tasks, out)
            for t in ids:
                task = tasks[(episode, wf, t)]
                if task.passed is None:
                    out.note(self.name, NEVER_VALIDATED)
                value = (self.success if t in done else self.failure) + self.retry * task.retries \
                    + self.downstream * sum(d in done for d in bonus[t])
                if self.efficiency:
                    value += self.efficiency / (task.execution_ns / 1e9 + 1.0)
                reward = self._reward(episode, task, value, turns, out)
                if reward is not None:
                    out.rewards.append(reward)
            out.rewards.append(team_reward(episode, self.weight * self.workflow * len(done)
                                           / len(ids), self.name))
        return out

    def _reward(self, episode: str, task: Task, value: float,
                turns: Mapping[str, int], out: Derived) -> RecipeReward | None:
        agent = task.agent
        if agent is None:
            out.note(self.name, NO_AGENT)
            return None
        turn = None
        if self.scope == sc.RewardScope.TURN:
            turn = turns.get(task.last_attempt or "")
            if turn is None:
                out.note(self.name, NO_TURN)
        return local_reward(episode, self.weight * value, agent, turn, self.name)

    def _tasks(self, spans: pa.Table, out: Derived) -> dict[TaskKey, Task]:
        return read_tasks(spans, out, self.name)

    def _dependents(self, episode: str, wf: str | None, ids: list[str],
                    tasks: Mapping[TaskKey, Task], out: Derived) -> dict[str, list[str]]:
        """Task -> its direct dependents, without edges to unknown tasks or within a cycle."""
        known = set(ids)
        edges: dict[str, list[str]] = {t: [] for t in ids}  # dependency -> dependents
        for t in ids:
            for d in sorted(tasks[(episode, wf, t)].depends_on):
                if d in known:
                    edges[d].append(t)
                else:
                    out.note(self.name, UNKNOWN_DEPENDENCY)
        component = strong_components(edges)
        result: dict[str, list[str]] = {}
        for d, dependents in edges.items():
            keep = [t for t in dependents if component[t] != component[d]]
            out.note(self.name, CYCLE, len(dependents) - len(keep))
            result[d] = keep
        return result


def read_tasks(spans: pa.Table, out: Derived, term: str) -> dict[TaskKey, Task]:
    """Every task of the unit's workflows, from its step spans (notes under ``term``): what
    the ``dag``, ``workflow`` and ``global`` terms share."""
    rows = named(spans, list(STEPS), [EPISODE_KEY, "name", "attributes", "span_id",
                                      "agent_name", "start_time_unix_nano",
                                      "end_time_unix_nano"])
    if rows.num_rows == 0:
        return {}
    rows = rows.take(pc.sort_indices(rows, sort_keys=[
        (EPISODE_KEY, "ascending"), ("start_time_unix_nano", "ascending"),
        ("span_id", "ascending")]))
    keys = [sc.WORKFLOW_ID, sc.WORKFLOW_TASK_ID, sc.WORKFLOW_TASK_DEPENDS_ON,
            sc.WORKFLOW_TASK_ATTEMPT, sc.WORKFLOW_VALIDATION_PASSED]
    tasks: dict[TaskKey, Task] = {}
    for row, attrs in zip(rows.select([EPISODE_KEY, "name", "span_id", "agent_name",
                                       "start_time_unix_nano", "end_time_unix_nano"]
                                      ).to_pylist(), attributes(rows, keys)):
        task_id = attrs.get(sc.WORKFLOW_TASK_ID)
        if not isinstance(task_id, str) or not task_id:
            out.note(term, NO_TASK_ID)
            continue
        wf = attrs.get(sc.WORKFLOW_ID)
        key = (row[EPISODE_KEY], wf if isinstance(wf, str) else None, task_id)
        task = tasks.setdefault(key, Task())
        _step(task, STEPS[row["name"]], row, attrs, out, term)
    return tasks


def _step(task: Task, step: str, row: dict[str, Any], attrs: dict[str, Any], out: Derived,
          term: str) -> None:
    agent = row["agent_name"]
    attempt = attrs.get(sc.WORKFLOW_TASK_ATTEMPT)
    if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt >= 0:
        task.max_attempt = max(task.max_attempt, attempt)
    deps = attrs.get(sc.WORKFLOW_TASK_DEPENDS_ON)
    if deps is not None:
        if isinstance(deps, list) and all(isinstance(d, str) for d in deps):
            task.depends_on.update(deps)
        else:
            out.note(term, BAD_DEPENDS_ON)
    start, end = row["start_time_unix_nano"], row["end_time_unix_nano"]
    if start is not None:
        task.first_ns = start if task.first_ns is None else min(task.first_ns, start)
    if end is not None:
        task.last_ns = end if task.last_ns is None else max(task.last_ns, end)
    if step in ("execute", "retry"):
        task.retry_spans += step == "retry"
        task.executor = agent or task.executor
        task.last_attempt = row["span_id"]
        if start is not None and end is not None and end > start:
            task.execution_ns += end - start
    elif step == "validate":
        passed = attrs.get(sc.WORKFLOW_VALIDATION_PASSED)
        if isinstance(passed, bool):
            task.passed = passed
        else:
            out.note(term, NO_VERDICT)
        task.other_agent = agent or task.other_agent
    elif agent is not None and task.other_agent is None:  # schedule
        task.other_agent = agent


def strong_components(edges: Mapping[str, list[str]]) -> dict[str, int]:
    """Strongly connected component of each node (Tarjan's algorithm, iterative: a long chain
    of tasks must not hit the recursion limit). Two tasks share one iff a cycle joins them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    comp: dict[str, int] = {}
    components: list[str] = []  # one node of each component found
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in edges:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            succ = edges[node]
            if i < len(succ):
                work.append((node, i + 1))
                nxt = succ[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                n = len(components)
                components.append(node)
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp[top] = n
                    if top == node:
                        break
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return comp


def _attempt_turns(spans: pa.Table, tasks: Mapping[TaskKey, Task]) -> dict[str, int]:
    """Span id of each task's last attempt -> the highest turn of the LLM calls inside it."""
    attempts = {t.last_attempt for t in tasks.values() if t.last_attempt}
    out: dict[str, int] = {}
    if not attempts:
        return out
    for r in chats(spans, ["parent_span_id", "turn_index"]).to_pylist():
        parent, turn = r["parent_span_id"], r["turn_index"]
        if parent in attempts and turn is not None:
            out[parent] = max(out.get(parent, turn), turn)
    return out
