"""``ScopeSpanProcessor``: stamp the agl-bridge scope on spans other libraries start.

Our own spans copy the scope themselves. Frameworks that emit spans of their own (autogen-core's
``invoke_agent`` and ``execute_tool``, for example) do not know it; this processor adds the
episode, agent and turn attributes in force when such a span starts, without overriding what
the span already set. One context lookup per span.
"""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from agl_bridge import semconv as sc
from agl_bridge.scope import scope_of


class ScopeSpanProcessor(SpanProcessor):
    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        scope = scope_of(parent_context if parent_context is not None
                         else otel_context.get_current())
        if not scope:
            return
        if span.instrumentation_scope is not None and \
                span.instrumentation_scope.name == sc.INSTRUMENTATION_SCOPE:
            return  # ours copy the scope themselves
        present = span.attributes or {}
        span.set_attributes({sc.SCOPE_ATTRIBUTES[k]: v for k, v in scope.items()
                             if sc.SCOPE_ATTRIBUTES[k] not in present})

    def on_end(self, span: ReadableSpan) -> None:
        pass
