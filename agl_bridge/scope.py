"""Scoping API: put spans in an episode, under an agent, at a turn; emit rewards.

For code with no framework integration. The scope lives in the OpenTelemetry context, so it
goes wherever trace context goes: into asyncio tasks by itself, into threads and thread pools
with the threading instrumentation (switched on by ``AGL_BRIDGE_AUTO``), and through any
framework that carries OpenTelemetry context across its own boundaries. Every span agl-bridge
starts copies the scope into its attributes, so each LLM span carries its episode, agent and
turn itself and the converter never has to guess them from the tree.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import uuid
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, cast

from opentelemetry import context as otel_context
from opentelemetry import trace

from agl_bridge import _lazy
from agl_bridge import semconv as sc
from agl_bridge._version import __version__
from agl_bridge.errors import record_error

_SCOPE_KEY = otel_context.create_key("agl_bridge.scope")
# the context key the scope is stored under, for span processors that look it up per span
# (``context.get(SCOPE_CONTEXT_KEY)``: a mapping of SCOPE_ATTRIBUTES keys, or None)
SCOPE_CONTEXT_KEY: str = _SCOPE_KEY
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def tracer() -> trace.Tracer:
    """Our tracer on the global provider (a proxy until one is set, so import order is free)."""
    _lazy.ensure()
    return trace.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__)


def current_scope() -> Mapping[str, Any]:
    """The scope in force here: keys of ``semconv.SCOPE_ATTRIBUTES`` that are set."""
    return _scope(otel_context.get_value(_SCOPE_KEY))


def _scope(value: object) -> Mapping[str, Any]:
    """The scope stored in a context (only this module stores it: no check on the hot path)."""
    return cast(Mapping[str, Any], value or _EMPTY)


def scope_attributes() -> dict[str, Any]:
    """The current scope as span attributes."""
    return {sc.SCOPE_ATTRIBUTES[k]: v for k, v in current_scope().items()}


def context_with_scope(ctx: otel_context.Context | None = None, **scope: Any
                       ) -> otel_context.Context:
    """``ctx`` (default: the current context) with keys added to its scope (None = unchanged).

    For integrations that see a framework's start and end callbacks instead of a block of code:
    they ``attach`` the returned context at start and ``detach`` it at the end.
    """
    base = _scope(otel_context.get_value(_SCOPE_KEY, ctx))
    merged = MappingProxyType({**base, **{k: v for k, v in scope.items() if v is not None}})
    return otel_context.set_value(_SCOPE_KEY, merged, ctx)


def scope_of(ctx: otel_context.Context) -> Mapping[str, Any]:
    return _scope(otel_context.get_value(_SCOPE_KEY, ctx))


@contextlib.contextmanager
def scoped(**scope: Any) -> Iterator[Mapping[str, Any]]:
    """Add keys of ``semconv.SCOPE_ATTRIBUTES`` to the scope for the block (None = unchanged)."""
    merged = MappingProxyType({**current_scope(),
                               **{k: v for k, v in scope.items() if v is not None}})
    token = otel_context.attach(otel_context.set_value(_SCOPE_KEY, merged))
    try:
        yield merged
    finally:
        _detach(token)


def _detach(token: Any) -> None:
    """Detach, tolerating an async generator closed from another context (at garbage
    collection, or by a different task): that context never saw the attach, so there is
    nothing to undo there, and OpenTelemetry would log an error into the application."""
    try:
        token.var.reset(token)
    except (ValueError, RuntimeError):
        pass


@contextlib.contextmanager
def _scoped(span_name: str, extra_attributes: Mapping[str, Any], **scope: Any) -> Iterator[Any]:
    """A scope change with a span around it that carries the new scope.

    An exception leaving the block fails the span with its text kept by the capture level
    (``record_error``), not by OpenTelemetry's defaults, which keep it all at every level.
    """
    with scoped(**scope) as merged:
        attributes = {sc.SCOPE_ATTRIBUTES[k]: v for k, v in merged.items()}
        attributes.update(extra_attributes)
        with tracer().start_as_current_span(span_name, attributes=attributes,
                                            record_exception=False,
                                            set_status_on_exception=False) as span:
            try:
                yield span
            except Exception as exc:  # as OpenTelemetry's default: not GeneratorExit & co.
                record_error(span, exc)
                raise


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
    _check_index("turn", index)
    with _scoped(sc.SPAN_TURN, {}, turn_index=index) as span:
        yield span


@contextlib.contextmanager
def candidate(index: int) -> Iterator[None]:
    """Mark calls inside as candidate ``index`` of K sampled alternatives of one agent-turn."""
    _check_index("candidate", index)
    with scoped(candidate_index=index):
        yield None


@contextlib.contextmanager
def coordination_round(index: int) -> Iterator[Any]:
    """Spans inside belong to coordination round ``index`` of a voting/debating orchestrator."""
    _check_index("coordination_round", index)
    with _scoped(sc.SPAN_ROUND, {}, coordination_round=index) as span:
        yield span


def _check_index(what: str, index: Any) -> None:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"agl_bridge.{what}(index): index must be an int >= 0, got {index!r}")


def finite_number(value: Any, where: str) -> float:
    """``value`` as a float, refused (naming ``where``) unless a finite real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{where} must be finite, got {value!r}")
    return value


def emit_reward(
    value: float | Mapping[str, float],
    *,
    scope: str = sc.RewardScope.EPISODE,
    kind: str = sc.RewardKind.TASK,
    name: str | None = None,
) -> float:
    """Record a reward as a zero-length ``agl_bridge.reward`` span in the current scope.

    ``value`` is a number, or named parts (``{"correct": 1.0, "format": 0.5}``) whose sum is the
    value and which are kept one attribute each. ``scope`` says who the reward is for (turn,
    agent, team, episode); ``kind`` where it came from. A reward that is not a finite number is
    refused here, where the caller can still see the line that made it, rather than poisoning a
    training batch later. Returns the value recorded.
    """
    parts: dict[str, float] = {}
    if isinstance(value, Mapping):
        if not value:
            raise ValueError("emit_reward: parts must not be empty")
        for part, v in value.items():
            if not isinstance(part, str) or not part:
                raise ValueError(f"emit_reward: part names must be non-empty strings, got {part!r}")
            parts[part] = finite_number(v, f"emit_reward: part {part!r}")
        value = math.fsum(parts.values())
    else:
        value = finite_number(value, "emit_reward: value")
    if scope not in sc.RewardScope.ALL:
        raise ValueError(f"emit_reward: scope must be one of {sc.RewardScope.ALL}, got {scope!r}")
    if kind not in sc.RewardKind.ALL:
        raise ValueError(f"emit_reward: kind must be one of {sc.RewardKind.ALL}, got {kind!r}")
    attributes = scope_attributes()
    attributes.update({sc.REWARD_VALUE: value, sc.REWARD_SCOPE: scope, sc.REWARD_KIND: kind})
    if name:
        attributes[sc.REWARD_NAME] = name
    attributes.update({sc.reward_part_attribute(p): v for p, v in parts.items()})
    span = tracer().start_span(sc.SPAN_REWARD, attributes=attributes)
    # the same score in OpenTelemetry's standard form, for evaluation tools reading the trace
    # (the converter counts the reward span, not this event)
    span.add_event(sc.GEN_AI_EVALUATION_RESULT, {sc.GEN_AI_EVALUATION_NAME: name or kind,
                                                 sc.GEN_AI_EVALUATION_SCORE_VALUE: value})
    span.end()
    return value
