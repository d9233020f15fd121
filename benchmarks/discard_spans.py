"""The tracer provider the overhead workers measure under: our ScopeSpanProcessor plus a
BatchSpanProcessor into an exporter that only counts, so export IO is not in the figure.
Imported by integration_overhead.py (dev venv) and overhead_massgen.py (MassGen's venv)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from agl_bridge.otel.processors import ScopeSpanProcessor


class Discard(SpanExporter):
    spans = 0  # exported so far, across instances

    def export(self, spans):
        Discard.spans += len(spans)
        return SpanExportResult.SUCCESS


def install_discarding_provider() -> tuple[TracerProvider, type[Discard]]:
    """Set the global provider; returns it and the counter class (``Discard.spans``)."""
    provider = TracerProvider()
    provider.add_span_processor(ScopeSpanProcessor())
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    trace.set_tracer_provider(provider)
    return provider, Discard
