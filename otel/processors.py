"""``ScopeSpanProcessor``: stamp the agl-bridge scope on spans other libraries start.

Our own spans copy the scope themselves. Frameworks that emit spans of their own (autogen-core's
``invoke_agent`` and ``execute_tool``, and its runtime's messaging spans, for example) do not
know it; this processor adds the episode, agent and turn attributes in force when such a span
starts, without overriding what the span already set.

It runs for every span a framework starts (autogen-core starts about 17 per LLM call), so it
does little per span. A scope is an immutable mapping made once per ``scoped`` block; the span
attributes of the last few scopes seen are kept, with whether their values are plain scalars
(checked once per scope, not per span). Stamping happens in ``on_start``, before the SDK hands
the span to anyone, so the attributes go straight into the span's dict with one update
(``attributes.stamp_starting_span``), no lock and no per-value check, when they fit the span's
limits; otherwise they take the checked path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from agl_bridge import semconv as sc
from agl_bridge.otel.attributes import plain_scalars, stamp_starting_span
from agl_bridge.scope import SCOPE_CONTEXT_KEY

_KEEP = 64  # scopes whose attributes are kept; a team step switches between a handful


class ScopeSpanProcessor(SpanProcessor):
    def __init__(self) -> None:
        # id(scope) -> (scope, its span attributes, plain_scalars of them). The scope is held, so
        # its id is not reused while it is here; the dict is replaced whole when full, and a
        # lost insert from a race only costs a recomputation, so threads need no lock.
        self._stamps: dict[int, tuple[Mapping[str, Any], dict[str, Any], int | None]] = {}

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        # what scope_of does, without two calls per span
        scope: Any = (parent_context if parent_context is not None
                      else otel_context.get_current()).get(SCOPE_CONTEXT_KEY)
        if not scope:
            return
        library = span.instrumentation_scope
        if library is not None and library.name == sc.INSTRUMENTATION_SCOPE:
            return  # ours copy the scope themselves
        stamps = self._stamps
        kept = stamps.get(id(scope))
        if kept is None or kept[0] is not scope:
            stamp = {sc.SCOPE_ATTRIBUTES[k]: v for k, v in scope.items()}
            longest = plain_scalars(stamp)
            if len(stamps) >= _KEEP:
                self._stamps = stamps = {}
            stamps[id(scope)] = (scope, stamp, longest)
        else:
            stamp, longest = kept[1], kept[2]
        stamp_starting_span(span, stamp, longest)

    def on_end(self, span: ReadableSpan) -> None:
        pass
