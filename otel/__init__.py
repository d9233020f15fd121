"""Capture side: tracer setup, exporters, the OTLP receiver (``agl_bridge.otel``).

Attributes load on first use (PEP 562), so ``AGL_BRIDGE_AUTO`` start-up does not import
pyarrow until a span is about to be exported.
"""

from importlib import import_module
from typing import Any

_LAZY = {
    "ParquetSpanExporter": "agl_bridge.otel.parquet_exporter",
    "SpanParquetWriter": "agl_bridge.otel.parquet_writer",
    "build_row": "agl_bridge.otel.rows",
    "span_to_row": "agl_bridge.otel.rows",
    "configure_tracing": "agl_bridge.otel.setup",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agl_bridge.otel' has no attribute {name!r}")
