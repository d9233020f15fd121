"""``ScopeSpanProcessor``: stamp the agl-bridge scope on spans other libraries start.

Our own spans copy the scope themselves. Frameworks that emit spans of their own (autogen-core's
``invoke_agent`` and ``execute_tool``, for example) do not know it; this processor adds the
episode, agent and turn attributes in force when such a span starts, without overriding what
the span already set.

It runs for every span a framework starts (autogen-core starts about 15 per LLM call), so it
does little per span: the attributes of the last scope seen are kept (a scope is an immutable
mapping made once per ``scoped`` block), what the span already holds is read from its attribute
dict rather than through a read-only view, and the values, plain strings and numbers, are stored
as ``set_attributes`` would store them without its per-value checks (``attributes.set_scalars``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from agl_bridge import semconv as sc
from agl_bridge.otel.attributes import attribute_dict, set_scalars
from agl_bridge.scope import scope_of


class ScopeSpanProcessor(SpanProcessor):
    def __init__(self) -> None:
        # (scope, its span attributes): read and replaced whole, so threads need no lock
        self._last: tuple[Mapping[str, Any], dict[str, Any]] | None = None

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        scope = scope_of(parent_context if parent_context is not None
                         else otel_context.get_current())
        if not scope:
            return
        library = span.instrumentation_scope
        if library is not None and library.name == sc.INSTRUMENTATION_SCOPE:
            return  # ours copy the scope themselves
        last = self._last
        if last is not None and last[0] is scope:
            stamp = last[1]
        else:
            stamp = {sc.SCOPE_ATTRIBUTES[k]: v for k, v in scope.items()}
            self._last = (scope, stamp)
        present = attribute_dict(span)
        if not present.keys().isdisjoint(stamp):
            stamp = {k: v for k, v in stamp.items() if k not in present}
        set_scalars(span, stamp)

    def on_end(self, span: ReadableSpan) -> None:
        pass
