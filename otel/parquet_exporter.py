"""An OpenTelemetry ``SpanExporter`` writing span rows to Parquet through ``SpanParquetWriter``.

Each exported batch is durable when ``export`` returns (write-ahead log); files appear,
rotated by size and age, under hive partitions. A span that cannot become a row is not dropped:
it is quarantined as JSON beside the data and counted, and the rest of its batch is written.

``OTEL_TRACES_EXPORTER=parquet`` builds this class with no arguments (an entry point): the
directory then comes from ``AGL_BRIDGE_PARQUET_DIR`` (default ``./agl_bridge_traces``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from agl_bridge.otel.parquet_writer import SpanParquetWriter
from agl_bridge.otel.span_columns import spans_to_tables

logger = logging.getLogger(__name__)

PARQUET_DIR_ENV = "AGL_BRIDGE_PARQUET_DIR"
DEFAULT_PARQUET_DIR = "agl_bridge_traces"


class ParquetSpanExporter(SpanExporter):
    """Write exported spans as Parquet under ``directory`` (see ``SpanParquetWriter``)."""

    #: A span is durable once exported, not once ended: a batch processor in front of this
    #: exporter should export at least this often (``setup._processor`` makes it so). Then a
    #: ``kill -9`` loses the spans that ended in about the last 200 ms, plus those queued
    #: behind a batch still being written (docs/reliability.md).
    MAX_EXPORT_DELAY_MS = 200

    def __init__(self, directory: str | os.PathLike[str] | None = None, **writer_options: Any
                 ) -> None:
        directory = directory or os.environ.get(PARQUET_DIR_ENV) or DEFAULT_PARQUET_DIR
        self.writer = SpanParquetWriter(directory, **writer_options)
        self.directory = self.writer.directory
        self._shutdown = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        try:
            # a malformed span must not take the batch with it: it is quarantined
            made = spans_to_tables(spans)
            self.writer.write_tables(made.tables)
            if made.bad:
                self.writer.quarantine([{"error": why, "span": _span_json(span)}
                                        for span, why in made.bad])
        except Exception:
            logger.exception("agl_bridge: writing %d spans to %s failed", len(spans),
                             self.directory)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    @property
    def spans_written(self) -> int:
        return self.writer.rows_written

    @property
    def spans_quarantined(self) -> int:
        return self.writer.rows_quarantined

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        self.writer.flush()
        return True

    def shutdown(self) -> None:
        if not self._shutdown:
            self._shutdown = True
            self.writer.close()


def _span_json(span: ReadableSpan) -> Any:
    try:
        return json.loads(span.to_json())
    except Exception as exc:  # even to_json can fail on a broken span: keep what we can
        return {"repr": repr(span), "to_json_error": repr(exc)}
