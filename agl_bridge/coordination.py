"""The vocabulary orchestrators use to say how agents coordinate, as spans training can read.

Voting/debating orchestrators (MassGen-style): ``new_answer``, ``vote``, ``restart``,
``final_selection`` are instants, recorded as zero-length spans in the current scope, so each is
one Parquet row a converter can count (votes received, restarts caused) to build vote and
coordination rewards. ``coordination_round`` (in ``agl_bridge.scope``) groups them in rounds.

DAG workflows (Flow-style): ``workflow`` wraps one run; ``task_step`` wraps one step of one task:
``schedule``, ``execute``, ``validate`` or ``retry``, with the task's dependencies and attempt,
so per-task rewards (success, retries spent) can be computed from the spans alone.

Free text (answers, vote reasons) is content: kept only at ``AGL_BRIDGE_CAPTURE=messages``.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry.trace import Span

from agl_bridge import semconv as sc
from agl_bridge.capture import capture_messages
from agl_bridge.scope import _scoped, scope_attributes, scoped, tracer


def _instant(span_name: str, attributes: Mapping[str, Any]) -> None:
    attrs = scope_attributes()
    attrs.update({k: v for k, v in attributes.items() if v is not None})
    tracer().start_span(span_name, attributes=attrs).end()


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def new_answer(agent: str, content: str | None = None, *, label: str | None = None) -> None:
    """``agent`` put forward a new answer (``label``: how the orchestrator refers to it)."""
    _instant(sc.SPAN_NEW_ANSWER, {
        sc.COORDINATION_AGENT: _name(agent, "new_answer: agent"), sc.ANSWER_LABEL: label,
        sc.ANSWER_CONTENT: content if capture_messages() else None})


def vote(voter: str, target: str, reason: str | None = None) -> None:
    """``voter`` voted for ``target``'s answer (real agent ids, not anonymised labels)."""
    _instant(sc.SPAN_VOTE, {
        sc.VOTE_VOTER: _name(voter, "vote: voter"), sc.VOTE_TARGET: _name(target, "vote: target"),
        sc.VOTE_REASON: reason if capture_messages() else None})


def restart(agent: str, reason: str | None = None) -> None:
    """``agent`` was restarted (its earlier answer or vote no longer counts)."""
    _instant(sc.SPAN_RESTART, {sc.COORDINATION_AGENT: _name(agent, "restart: agent"),
                               sc.COORDINATION_REASON: reason})


def final_selection(agent: str, *, vote_counts: Mapping[str, int] | None = None,
                    reason: str | None = None) -> None:
    """The orchestrator chose ``agent``'s answer; ``vote_counts`` are the tallies it used."""
    if vote_counts is not None:
        bad = [k for k, v in vote_counts.items() if not isinstance(v, int) or isinstance(v, bool)]
        if bad:
            raise ValueError(f"final_selection: vote counts must be ints, bad for {bad}")
    _instant(sc.SPAN_FINAL_SELECTION, {
        sc.COORDINATION_AGENT: _name(agent, "final_selection: agent"),
        sc.VOTE_COUNTS: json.dumps(dict(vote_counts), sort_keys=True) if vote_counts else None,
        sc.COORDINATION_REASON: reason})


@contextlib.contextmanager
def workflow(workflow_id: str | None = None) -> Iterator[str]:
    """One run of a DAG workflow; yields its id (a fresh uuid by default)."""
    workflow_id = workflow_id or uuid.uuid4().hex
    with _scoped(sc.SPAN_WORKFLOW, {}, workflow_id=workflow_id):
        yield workflow_id


class TaskStep:
    """Handle of a running task step; ``passed()`` records a validation verdict."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def passed(self, ok: bool) -> None:
        self.span.set_attribute(sc.WORKFLOW_VALIDATION_PASSED, bool(ok))


@contextlib.contextmanager
def task_step(task_id: str, step: str, *, depends_on: Sequence[str] = (),
              agent: str | None = None, attempt: int = 0) -> Iterator[TaskStep]:
    """One step (schedule, execute, validate, retry) of task ``task_id`` in the current workflow.

    LLM calls inside are stamped with the task id (and ``agent``, if given, as the agent).
    """
    if step not in sc.WORKFLOW_STEPS:
        raise ValueError(f"task_step: step must be one of {sc.WORKFLOW_STEPS}, got {step!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise ValueError(f"task_step: attempt must be an int >= 0, got {attempt!r}")
    extra: dict[str, Any] = {sc.WORKFLOW_TASK_ATTEMPT: attempt}
    if depends_on:
        extra[sc.WORKFLOW_TASK_DEPENDS_ON] = [_name(d, "task_step: dependency") for d in depends_on]
    with _scoped(sc.workflow_step_span_name(step), extra,
                 workflow_task_id=_name(task_id, "task_step: task_id"), agent_name=agent) as span:
        yield TaskStep(span)


__all__ = ["TaskStep", "final_selection", "new_answer", "restart", "scoped", "task_step", "vote",
           "workflow"]
