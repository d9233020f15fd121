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

import logging
import os
import weakref
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from agl_bridge import semconv as sc
from agl_bridge.otel.attributes import _FAST, stamp_starting_span
from agl_bridge.scope import _STAMPS, SCOPE_CONTEXT_KEY, get_context, scope_stamp

try:
    from opentelemetry.attributes import BoundedAttributes as _Bounded
except ImportError:  # pragma: no cover - the SDK is a dependency
    _Bounded = None  # type: ignore[assignment,misc]

_OURS = sc.INSTRUMENTATION_SCOPE
logger = logging.getLogger(__name__)


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


# -- training data stays out of the application's own exporters --------------------------------
TRAINING_ATTRIBUTES = frozenset({sc.PROMPT_TOKEN_IDS, sc.COMPLETION_TOKEN_IDS,
                                 sc.COMPLETION_LOGPROBS})
EXPORT_TRAINING_DATA_ENV = "AGL_BRIDGE_EXPORT_TOKEN_IDS"  # "1": the application's too


class WithoutTrainingData(SpanProcessor):
    """One of the application's own processors, handed each span without the token ids and
    logprobs that only training reads (about 8 KB per chat span at 48 tokens: volume, and cost,
    in the user's APM). Our exporters (Parquet, the OTLP of ``collect``) get the span whole."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        self.inner.on_start(span, parent_context=parent_context)

    def _on_ending(self, span: Span) -> None:
        self.inner._on_ending(span)

    def on_end(self, span: ReadableSpan) -> None:
        attributes = span.attributes
        if attributes and not TRAINING_ATTRIBUTES.isdisjoint(attributes):
            span = ReadableSpan(
                span.name, span.context, span.parent, span.resource,
                {k: v for k, v in attributes.items() if k not in TRAINING_ATTRIBUTES},
                span.events, span.links, span.kind, status=span.status,
                start_time=span.start_time, end_time=span.end_time,
                instrumentation_scope=span.instrumentation_scope)
        self.inner.on_end(span)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def ours(processor: SpanProcessor) -> SpanProcessor:
    """Mark one of agl-bridge's processors: it gets spans whole."""
    processor._agl_bridge_whole = True  # type: ignore[attr-defined]
    return processor


def keep_training_data_out(provider: Any) -> None:
    """Wrap the application's processors on ``provider``, those there now and those it adds
    later, in ``WithoutTrainingData`` (once per provider; off with
    ``AGL_BRIDGE_EXPORT_TOKEN_IDS=1``)."""
    if os.environ.get(EXPORT_TRAINING_DATA_ENV, "").strip() in ("1", "true") or getattr(
            provider, "_agl_bridge_guarded", False):
        return

    def guarded(p: SpanProcessor) -> SpanProcessor:
        mine = isinstance(p, (ScopeSpanProcessor, WithoutTrainingData)) or getattr(
            p, "_agl_bridge_whole", False)
        return p if mine else WithoutTrainingData(p)

    multi = provider._active_span_processor
    with multi._lock:
        multi._span_processors = tuple(guarded(p) for p in multi._span_processors)
    add = provider.add_span_processor
    provider.add_span_processor = lambda p: add(guarded(p))
    provider._agl_bridge_guarded = True


# -- bounded shutdown, counted losses ---------------------------------------------------------
SHUTDOWN_BOUND_S = 10.0  # a program's exit waits at most this for our exporters


class _CountedExporter(SpanExporter):
    """Counts the spans an exporter refused (a failure result, or an exception such as a full
    disk), said once as a line, not a traceback per batch."""

    def __init__(self, inner: SpanExporter, lost: Counter[str]) -> None:
        self.inner, self.lost = inner, lost

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # any fault of the exporter: counted, never raised
            if not self.lost["refused by the exporter"]:
                logger.warning("agl_bridge: %s refused %d span(s): %s (counted from now on; the "
                               "total is logged at shutdown)", type(self.inner).__name__,
                               len(spans), exc)
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.lost["refused by the exporter"] += len(spans)
        return result

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        self.inner.shutdown(*args, **kwargs)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class BoundedBatchSpanProcessor(BatchSpanProcessor):
    """Our exporters' batch processor: shutdown returns within ``SHUTDOWN_BOUND_S`` whatever
    the exporter does (an OTLP endpoint down or hanging held a program's exit for 30 s, the
    SDK's join timeout, as each batch waited its own 10 s), and every span lost on the way (the
    queue full, refused by the exporter, still queued at the bound) is counted and said in one
    line at shutdown: ``lost``."""

    _instances: ClassVar[weakref.WeakSet[BoundedBatchSpanProcessor]] = weakref.WeakSet()

    def __init__(self, exporter: SpanExporter, **kwargs: Any) -> None:
        self.lost: Counter[str] = Counter()
        self.exporter_name = type(exporter).__name__
        super().__init__(_CountedExporter(exporter, self.lost), **kwargs)
        self._instances.add(self)

    @classmethod
    def live(cls) -> list[BoundedBatchSpanProcessor]:
        """This process's processors not yet collected: their ``lost`` counts are what a
        long-running command's metrics report (``otel/metrics.py``)."""
        return list(cls._instances)

    def on_end(self, span: ReadableSpan) -> None:
        queue = getattr(self._batch_processor, "_queue", None)
        if queue is not None and len(queue) == queue.maxlen:  # the SDK drops the oldest
            self.lost["dropped (queue full)"] += 1
        super().on_end(span)

    def shutdown(self) -> None:
        batch = self._batch_processor
        batch.shutdown(timeout_millis=int(SHUTDOWN_BOUND_S * 1000))
        left = len(getattr(batch, "_queue", ()))
        if left:
            self.lost[f"not exported within the {SHUTDOWN_BOUND_S:g} s shutdown bound"] += left
        if self.lost:
            logger.warning("agl_bridge: %s: %d span(s) not exported: %s", self.exporter_name,
                           sum(self.lost.values()),
                           ", ".join(f"{n} {why}" for why, n in self.lost.items()))
