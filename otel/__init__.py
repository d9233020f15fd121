"""Capture side: tracer setup and exporters (``agl_bridge.otel``)."""

from agl_bridge.otel.parquet_exporter import ParquetSpanExporter, span_to_row, spans_to_table
from agl_bridge.otel.setup import configure_tracing

__all__ = ["ParquetSpanExporter", "configure_tracing", "span_to_row", "spans_to_table"]
