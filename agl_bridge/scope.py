"""Scoping API: put spans in an episode, under an agent, at a turn; emit rewards.

For code with no framework integration. The scope lives in a ``contextvars.ContextVar`` so it
follows asyncio tasks for free; every span agl-bridge starts copies the current scope into its
attributes, so each LLM span carries its episode, agent and turn itself and the converter never
has to guess them from the tree.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
import uuid
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from opentelemetry import trace

from agl_bridge import semconv as sc
from agl_bridge._version import __version__

_SCOPE: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "agl_bridge_scope", default=MappingProxyType({})
)


def tracer() -> trace.Tracer:
    """Our tracer on the global provider (a proxy until one is set, so import order is free)."""
    return trace.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__)


def current_scope() -> Mapping[str, Any]:
    """The scope in force here: keys of ``semconv.SCOPE_ATTRIBUTES`` that are set."""
    return _SCOPE.get()


def scope_attributes() -> dict[str, Any]:
    """The current scope as span attributes."""
    return {sc.SCOPE_ATTRIBUTES[k]: v for k, v in _SCOPE.get().items()}


@contextlib.contextmanager
def _scoped(span_name: str, extra_attributes: Mapping[str, Any], **scope: Any) -> Iterator[Any]:
    merged = dict(_SCOPE.get())
    merged.update({k: v for k, v in scope.items() if v is not None})
    token = _SCOPE.set(MappingProxyType(merged))
    try:
        attributes = {sc.SCOPE_ATTRIBUTES[k]: v for k, v in merged.items()}
        attributes.update(extra_attributes)
        with tracer().start_as_current_span(span_name, attributes=attributes) as span:
            yield span
    finally:
        _SCOPE.reset(token)


@contextlib.contextmanager
def episode(episode_id: str | None = None, *, task_id: str | None = None) -> Iterator[str]:
    """One rollout of the team on one task. Yields the episode id (a fresh uuid by default).

    ``task_id`` names the problem: GRPO compares rollouts of the same task with each other.
    """
    episode_id = episode_id or uuid.uuid4().hex
    with _scoped(sc.SPAN_EPISODE, {}, episode_id=episode_id, task_id=task_id):
        yield episode_id


@contextlib.contextmanager
def agent(name: str, *, role: str | None = None) -> Iterator[Any]:
    """Spans inside are made by agent ``name``: an ``invoke_agent {name}`` span wraps them."""
    if not name:
        raise ValueError("agl_bridge.agent(name): name must be a non-empty string")
    extra = {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT}
    with _scoped(sc.invoke_agent_span_name(name), extra, agent_name=name, agent_role=role) as span:
        yield span


@contextlib.contextmanager
def turn(index: int) -> Iterator[Any]:
    """Spans inside belong to turn ``index`` (0-based) of the current agent."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"agl_bridge.turn(index): index must be an int >= 0, got {index!r}")
    with _scoped(sc.SPAN_TURN, {}, turn_index=index) as span:
        yield span


@contextlib.contextmanager
def candidate(index: int) -> Iterator[None]:
    """Mark calls inside as candidate ``index`` of K sampled alternatives of one agent-turn."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"agl_bridge.candidate(index): index must be an int >= 0, got {index!r}")
    merged = dict(_SCOPE.get(), candidate_index=index)
    token = _SCOPE.set(MappingProxyType(merged))
    try:
        yield None
    finally:
        _SCOPE.reset(token)


def emit_reward(
    value: float,
    *,
    scope: str = sc.RewardScope.EPISODE,
    kind: str = sc.RewardKind.TASK,
    name: str | None = None,
) -> None:
    """Record a reward as a zero-length ``agl_bridge.reward`` span in the current scope.

    ``scope`` says who the reward is for (turn, agent, team, episode); ``kind`` where it came
    from. A reward that is not a finite number is refused here, where the caller can still see
    the line that made it, rather than poisoning a training batch later.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"emit_reward: value must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"emit_reward: value must be finite, got {value!r}")
    if scope not in sc.RewardScope.ALL:
        raise ValueError(f"emit_reward: scope must be one of {sc.RewardScope.ALL}, got {scope!r}")
    if kind not in sc.RewardKind.ALL:
        raise ValueError(f"emit_reward: kind must be one of {sc.RewardKind.ALL}, got {kind!r}")
    attributes = scope_attributes()
    attributes.update({sc.REWARD_VALUE: value, sc.REWARD_SCOPE: scope, sc.REWARD_KIND: kind})
    if name:
        attributes[sc.REWARD_NAME] = name
    tracer().start_span(sc.SPAN_REWARD, attributes=attributes).end()
