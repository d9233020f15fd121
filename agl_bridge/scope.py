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
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context

from agl_bridge import _lazy
from agl_bridge import semconv as sc
from agl_bridge._version import __version__
from agl_bridge.errors import record_error

_SCOPE_KEY = otel_context.create_key("agl_bridge.scope")
# the context key the scope is stored under, for span processors that look it up per span
# (``context.get(SCOPE_CONTEXT_KEY)``: a mapping of SCOPE_ATTRIBUTES keys, or None)
SCOPE_CONTEXT_KEY: str = _SCOPE_KEY
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _context_var() -> Any:
    """The ContextVar behind OpenTelemetry's current context when the runtime context is the
    default ``contextvars`` one (then reading and attaching need not go through its API's two
    Python frames per call); None otherwise."""
    try:
        from opentelemetry.context import _RUNTIME_CONTEXT
        from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
    except ImportError:  # pragma: no cover - another API release
        return None
    if type(_RUNTIME_CONTEXT) is ContextVarsRuntimeContext:
        return getattr(_RUNTIME_CONTEXT, "_current_context", None)
    return None  # pragma: no cover - OTEL_PYTHON_CONTEXT names another runtime context


_VAR = _context_var()
# the current OpenTelemetry context, and attaching one: what otel_context.get_current and
# otel_context.attach do, without their Python frames when the runtime is the contextvars one
get_context: Callable[[], Context] = _VAR.get if _VAR is not None else otel_context.get_current
attach_context: Callable[[Context], Any] = (_VAR.set if _VAR is not None
                                            else otel_context.attach)

# id(scope) -> (scope, its span attributes, plain_scalars of them), for the scopes seen last. A
# scope is an immutable mapping made once per ``scoped`` block (or callback run) and then read
# by every span started in it: its attributes are made once, not per span. The scope is held,
# so its id is not reused while it is here; the dict is replaced whole when full, and a lost
# insert from a race only costs a recomputation, so threads need no lock.
_STAMPS: dict[int, tuple[Mapping[str, Any], dict[str, Any], int | None]] = {}
_KEEP = 64  # a team step switches between a handful


def scope_stamp(scope: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, Any], int | None]:
    """``(scope, its span attributes, plain_scalars(attributes))``, kept for the last scopes
    seen. The attribute dict is shared: never modify it."""
    kept = _STAMPS.get(id(scope))
    if kept is not None and kept[0] is scope:
        return kept
    attributes = {sc.SCOPE_ATTRIBUTES[k]: v for k, v in scope.items()}
    kept = (scope, attributes, plain_scalars(attributes))
    stamps = _STAMPS
    if len(stamps) >= _KEEP:
        stamps.clear()
    stamps[id(scope)] = kept
    return kept


_SCALARS = frozenset({str, bool, int, float})


def plain_scalars(attributes: Mapping[str, Any]) -> int | None:
    """The longest string among ``attributes``' values (0 if none) when every value is a plain
    ``str``, ``bool``, ``int`` or ``float`` under a non-empty ``str`` key; None otherwise. For
    ``agl_bridge.otel.attributes.stamp_starting_span``, which checks that length against the
    span's limit."""
    longest = 0
    for key, value in attributes.items():
        kind = type(value)
        if kind not in _SCALARS or type(key) is not str or not key:
            return None
        if kind is str and len(value) > longest:
            longest = len(value)
    return longest


def _merged(base: object, scope: Mapping[str, Any]) -> Mapping[str, Any]:
    """The scope ``base`` (a stored scope or None) with ``scope``'s keys that are not None."""
    add = {k: v for k, v in scope.items() if v is not None}
    return MappingProxyType({**base, **add} if base else add)  # type: ignore[dict-item]


def _with_scope(ctx: Context, merged: Mapping[str, Any]) -> Context:
    """What ``otel_context.set_value(_SCOPE_KEY, merged, ctx)`` returns."""
    values = ctx.copy()
    values[_SCOPE_KEY] = merged
    return Context(values)


def tracer() -> trace.Tracer:
    """Our tracer on the global provider (a proxy until one is set, so import order is free)."""
    _lazy.ensure()
    return trace.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__)


def current_scope() -> Mapping[str, Any]:
    """The scope in force here: keys of ``semconv.SCOPE_ATTRIBUTES`` that are set."""
    return cast(Mapping[str, Any], get_context().get(_SCOPE_KEY) or _EMPTY)


def _scope(value: object) -> Mapping[str, Any]:
    """The scope stored in a context (only this module stores it: no check on the hot path)."""
    return cast(Mapping[str, Any], value or _EMPTY)


def scope_attributes() -> dict[str, Any]:
    """The current scope as span attributes (a new dict each call)."""
    return scope_attributes_of(get_context().get(_SCOPE_KEY))


def scope_attributes_of(scope: Any) -> dict[str, Any]:
    """A stored scope (or None) as span attributes (a new dict each call): a copy of the kept
    ones when the scope has been stamped on a span (``scope_stamp``), else made here (a scope
    that only our own spans read is not kept)."""
    if not scope:
        return {}
    kept = _STAMPS.get(id(scope))
    if kept is not None and kept[0] is scope:
        return dict(kept[1])
    return {sc.SCOPE_ATTRIBUTES[k]: v for k, v in scope.items()}


def context_with_scope(ctx: otel_context.Context | None = None, **scope: Any
                       ) -> otel_context.Context:
    """``ctx`` (default: the current context) with keys added to its scope (None = unchanged).

    For integrations that see a framework's start and end callbacks instead of a block of code:
    they ``attach`` the returned context at start and ``detach`` it at the end.
    """
    if ctx is None:
        ctx = get_context()
    return _with_scope(ctx, _merged(ctx.get(_SCOPE_KEY), scope))


def scope_of(ctx: otel_context.Context) -> Mapping[str, Any]:
    return _scope(otel_context.get_value(_SCOPE_KEY, ctx))


class scoped:  # used as a function: ``with scoped(...) as merged``
    """Add keys of ``semconv.SCOPE_ATTRIBUTES`` to the scope for the block (None = unchanged).

    ``with scoped(agent_name=...) as merged``: ``merged`` is the scope in force in the block. A
    class rather than a generator context manager: integrations enter one per agent turn and
    speaker selection, and this is the whole of what it does (one context copied and
    attached, then detached).
    """

    __slots__ = ("_scope", "_token")

    def __init__(self, **scope: Any) -> None:
        self._scope = scope
        self._token: Any = None

    def __enter__(self) -> Mapping[str, Any]:
        ctx = get_context()
        merged = _merged(ctx.get(_SCOPE_KEY), self._scope)
        self._token = attach_context(_with_scope(ctx, merged))
        return merged

    def __exit__(self, *exc_info: object) -> None:
        _detach(self._token)


def _detach(token: Any) -> None:
    """Detach, tolerating an async generator closed from another context (at garbage
    collection, or by a different task): that context never saw the attach, so there is
    nothing to undo there, and OpenTelemetry would log an error into the application."""
    try:
        token.var.reset(token)
    except (ValueError, RuntimeError):
        pass


# detaching what ``attach_context`` attached: ``_detach`` when the runtime is the contextvars one
# (no frames of OpenTelemetry's API in between), else OpenTelemetry's own
detach_context: Callable[[Any], None] = _detach if _VAR is not None else otel_context.detach


@contextlib.contextmanager
def _scoped(span_name: str, extra_attributes: Mapping[str, Any], **scope: Any) -> Iterator[Any]:
    """A scope change with a span around it that carries the new scope.

    An exception leaving the block fails the span with its text kept by the capture level
    (``record_error``), not by OpenTelemetry's defaults, which keep it all at every level.
    """
    with scoped(**scope) as merged:
        attributes = scope_attributes_of(merged)
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


def score_parts(value: float | Mapping[str, float], who: str) -> tuple[float, dict[str, float]]:
    """A score given as a number or as named parts (their sum is the score) -> (score, parts),
    refused (naming ``who``) unless each part is named and every number, the sum too, is
    finite: where the caller can still see the line that made it."""
    if not isinstance(value, Mapping):
        return finite_number(value, f"{who}: value"), {}
    if not value:
        raise ValueError(f"{who}: parts must not be empty")
    parts: dict[str, float] = {}
    for part, v in value.items():
        if not isinstance(part, str) or not part:
            raise ValueError(f"{who}: part names must be non-empty strings, got {part!r}")
        parts[part] = finite_number(v, f"{who}: part {part!r}")
    try:
        total = math.fsum(parts.values())
    except OverflowError:
        total = math.inf
    if not math.isfinite(total):
        raise ValueError(f"{who}: the parts sum past the range of a number")
    return total, parts


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
    value, parts = score_parts(value, "emit_reward")
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
