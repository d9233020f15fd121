"""``ScopeSpanProcessor``: stamp the agl-bridge scope on spans other libraries start.

Our own spans copy the scope themselves. Frameworks that emit spans of their own (autogen-core's
``invoke_agent`` and ``execute_tool``, and its runtime's messaging spans, for example) do not
know it; this processor adds the episode, agent and turn attributes in force when such a span
starts, without overriding what the span already set.

It runs for every span a framework starts (autogen-core starts about 17 per LLM call), so it
does little per span, in one Python frame. A scope is an immutable mapping made once per
``scoped`` block; its span attributes, and whether their values are plain scalars, are kept for
the last scopes seen (``scope.scope_stamp``, shared with the integrations), not made per span.
Stamping happens in ``on_start``, before the SDK hands the span to anyone, so the attributes go
straight into the span's dict with one update, no lock and no per-value check, when they fit
the span's limits and the span holds none of them; otherwise ``stamp_starting_span`` takes
over (keys the span set itself are kept, and the checked path for spans at their limits).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from agl_bridge import semconv as sc
from agl_bridge.otel.attributes import _FAST, stamp_starting_span
from agl_bridge.scope import _STAMPS, SCOPE_CONTEXT_KEY, get_context, scope_stamp

try:
    from opentelemetry.attributes import BoundedAttributes as _Bounded
except ImportError:  # pragma: no cover - the SDK is a dependency
    _Bounded = None  # type: ignore[assignment,misc]

_OURS = sc.INSTRUMENTATION_SCOPE


class ScopeSpanProcessor(SpanProcessor):
    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        # what scope_of does, without its calls
        scope: Any = (parent_context if parent_context is not None
                      else get_context()).get(SCOPE_CONTEXT_KEY)
        if not scope:
            return
        try:  # the SDK span's own fields: the public ones are two properties, a frame each
            library = span._instrumentation_scope
            name = library._name if library is not None else None
        except AttributeError:
            library = span.instrumentation_scope
            name = library.name if library is not None else None
        if name == _OURS:
            return  # ours copy the scope themselves
        kept = _STAMPS.get(id(scope))
        if kept is None or kept[0] is not scope:
            kept = scope_stamp(scope)
        stamp = kept[1]
        longest = kept[2]
        # stamp_starting_span's fast path, inline: plain values within the span's limits, no
        # key already set, room for all
        target = getattr(span, "_attributes", None)
        if _FAST and longest is not None and type(target) is _Bounded:
            inner = target._dict
            limit = target.max_value_len
            maxlen = target.maxlen
            if (type(inner) is dict and not target._immutable
                    and (limit is None or longest <= limit)
                    and (maxlen is None or len(inner) + len(stamp) <= maxlen)
                    and inner.keys().isdisjoint(stamp)):
                inner.update(stamp)
                return
        stamp_starting_span(span, stamp, longest)

    def on_end(self, span: ReadableSpan) -> None:
        pass
