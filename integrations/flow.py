"""Flow-style DAG orchestrators: a workflow of tasks with dependencies, each scheduled onto an
agent, executed, validated and retried, with rewards per task and per workflow.

The Flow framework of the design documents is not published, so this is an integration API its
orchestrator (or any like it) calls at the points it already has: ``Workflow`` around one run,
``Workflow.task`` around one task, and on the task ``schedule`` / ``execute`` / ``validate`` /
``retry``; ``Workflow.plan`` when a planner agent wrote the workflow. It records the spans
(``agl_bridge.workflow.task.*``, ``agl_bridge.workflow.plan``, through the emit API) and, when
the task ends, the task reward the design asks for::

    task reward     = success - retry_penalty * retries          (scope agent, to the executor)
    workflow reward = completed / total tasks                    (scope team: everyone's)

The constants are arguments; the rewards are ordinary ``agl_bridge.reward`` spans, so the
converter needs nothing Flow-specific. ``examples/flow_dag.py`` is a small orchestrator using it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agl_bridge import semconv as sc
from agl_bridge.coordination import task_step, workflow
from agl_bridge.scope import emit_reward, episode, scope_attributes, scoped, tracer


@dataclass
class TaskRun:
    """One task of a workflow run. Use its methods in the order the orchestrator runs them."""

    workflow: Workflow
    task_id: str
    depends_on: tuple[str, ...]
    agent: str | None = None
    attempts: int = 0
    passed: bool | None = None
    steps: list[str] = field(default_factory=list)

    def schedule(self, agent: str, *, planner: str | None = None, assignee: str | None = None,
                 requires: str | None = None,
                 capabilities: Mapping[str, Sequence[str]] | None = None) -> None:
        """The scheduler (a meta-agent, or a rule) assigned the task to ``agent``. When a
        planner's plan decided it: ``planner`` (its agent), ``assignee`` (the executor or tool
        the plan named), ``requires`` (what the task needs, as the orchestrator judges it) and
        the executors' ``capabilities``: what the delegation and tool-choice terms read."""
        self.agent = agent
        with task_step(self.task_id, "schedule", depends_on=self.depends_on,
                       agent=agent) as step:
            for key, value in ((sc.WORKFLOW_PLANNER, planner),
                               (sc.WORKFLOW_TASK_ASSIGNEE, assignee),
                               (sc.WORKFLOW_TASK_REQUIRES, requires)):
                if value is not None:
                    step.span.set_attribute(key, value)
            if capabilities is not None:
                step.span.set_attribute(sc.WORKFLOW_CAPABILITIES, json.dumps(
                    {k: list(v) for k, v in capabilities.items()}, sort_keys=True))
            self.steps.append("schedule")

    @contextlib.contextmanager
    def execute(self) -> Iterator[None]:
        """Around the executor's work: its LLM calls are stamped with task, agent and attempt."""
        step = "execute" if self.attempts == 0 else "retry"
        with task_step(self.task_id, step, agent=self.agent, attempt=self.attempts), \
                scoped(turn_index=self.attempts):
            self.steps.append(step)
            yield
        self.attempts += 1

    def validate(self, ok: bool) -> bool:
        """Record the validator's verdict on the latest attempt; returns it."""
        with task_step(self.task_id, "validate", agent=self.agent,
                       attempt=max(self.attempts - 1, 0)) as step:
            step.passed(ok)
        self.steps.append("validate")
        self.passed = bool(ok)
        return self.passed

    @property
    def retries(self) -> int:
        return max(self.attempts - 1, 0)


class Workflow:
    """One run of a DAG workflow: an episode of the team on one task description."""

    def __init__(self, workflow_id: str | None = None, *, task_id: str | None = None,
                 retry_penalty: float = 0.2) -> None:
        self.workflow_id = workflow_id
        self.task_id = task_id
        self.retry_penalty = retry_penalty
        self.tasks: dict[str, TaskRun] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Workflow:
        self._stack.enter_context(episode(task_id=self.task_id))
        self.workflow_id = self._stack.enter_context(workflow(self.workflow_id))
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.tasks:
                done = sum(1 for t in self.tasks.values() if t.passed)
                emit_reward(done / len(self.tasks), scope=sc.RewardScope.TEAM,
                            kind=sc.RewardKind.TASK, name="workflow_completion")
        finally:
            self._stack.__exit__(*exc)

    def plan(self, planner: str, *, valid: bool, problem: str | None = None,
             nodes: int | None = None, edges: int | None = None,
             depth: int | None = None) -> None:
        """``planner`` wrote the plan this workflow runs (or would have run): whether it passed
        the orchestrator's checks, the first ``problem`` if not, and its shape. One instant
        span in the planner's scope."""
        attrs: dict[str, Any] = {sc.WORKFLOW_PLANNER: planner, sc.WORKFLOW_PLAN_VALID: bool(valid)}
        for key, value in ((sc.WORKFLOW_PLAN_PROBLEM, problem), (sc.WORKFLOW_PLAN_NODES, nodes),
                           (sc.WORKFLOW_PLAN_EDGES, edges), (sc.WORKFLOW_PLAN_DEPTH, depth)):
            if value is not None:
                attrs[key] = value
        with scoped(agent_name=planner):
            span_attrs = scope_attributes()
            span_attrs.update(attrs)
            tracer().start_span(sc.SPAN_WORKFLOW_PLAN, attributes=span_attrs).end()

    @contextlib.contextmanager
    def task(self, task_id: str, *, depends_on: Sequence[str] = ()) -> Iterator[TaskRun]:
        """Around everything the orchestrator does for one task; rewards it when it ends."""
        if task_id in self.tasks:
            raise ValueError(f"workflow {self.workflow_id}: task {task_id!r} run twice")
        missing = [d for d in depends_on if d not in self.tasks]
        if missing:
            raise ValueError(f"workflow {self.workflow_id}: task {task_id!r} depends on "
                             f"{missing}, which have not run")
        run = TaskRun(self, task_id, tuple(depends_on))
        self.tasks[task_id] = run
        yield run
        if run.agent is not None:
            with scoped(agent_name=run.agent, workflow_task_id=task_id):
                emit_reward({"success": 1.0 if run.passed else 0.0,
                             "retries": -self.retry_penalty * run.retries},
                            scope=sc.RewardScope.AGENT, kind=sc.RewardKind.TASK,
                            name="task")
