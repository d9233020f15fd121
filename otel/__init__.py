"""Capture side: tracer setup and exporters (``agl_bridge.otel``)."""

from agl_bridge.otel.parquet_exporter import ParquetSpanExporter, spans_to_table
from agl_bridge.otel.parquet_writer import SpanParquetWriter
from agl_bridge.otel.rows import build_row, span_to_row
from agl_bridge.otel.setup import configure_tracing

__all__ = ["ParquetSpanExporter", "SpanParquetWriter", "build_row", "configure_tracing",
           "span_to_row", "spans_to_table"]
