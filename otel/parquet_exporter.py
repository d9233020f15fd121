"""An OpenTelemetry ``SpanExporter`` that writes span rows (``agl_bridge.schema.SPAN_SCHEMA``).

Each ``export`` call (one batch of a ``BatchSpanProcessor``) becomes one Parquet file, written
atomically, so a crash loses at most the batch in flight and no reader sees a partial file.
A span that cannot be turned into a row is not dropped: it goes, as OTLP-style JSON, to a
``_quarantine`` file beside the data, and is counted.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from agl_bridge.parquet_io import write_table_atomic
from agl_bridge.schema import PROMOTED_ATTRIBUTES, SPAN_SCHEMA

logger = logging.getLogger(__name__)

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _fit(value: Any, typ: pa.DataType) -> tuple[bool, Any]:
    """(fits, column value) for a promoted attribute; no coercion that could lose information."""
    if pa.types.is_string(typ):
        return isinstance(value, str), value
    if pa.types.is_int32(typ):
        return _is_int(value) and _INT32_MIN <= value <= _INT32_MAX, value
    if pa.types.is_float64(typ):
        return (isinstance(value, float) or _is_int(value)), value
    if pa.types.is_list(typ) and isinstance(value, (tuple, list)):
        inner = typ.value_type
        if pa.types.is_int32(inner):
            ok = all(_is_int(x) and _INT32_MIN <= x <= _INT32_MAX for x in value)
        else:
            ok = all(isinstance(x, float) or _is_int(x) for x in value)
        return ok, list(value)
    return False, None


def _hex(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def _json(obj: Any) -> str | None:
    return json.dumps(obj, separators=(",", ":")) if obj else None


def span_to_row(span: ReadableSpan) -> dict[str, Any]:
    """One span as a dict of SPAN_SCHEMA columns."""
    ctx = span.context
    if not isinstance(span.name, str):
        raise ValueError(f"span name must be a string, got {type(span.name).__name__}")
    if ctx is None or not ctx.trace_id or not ctx.span_id:
        raise ValueError("span has no valid trace id / span id")
    attrs = dict(span.attributes or {})
    row: dict[str, Any] = {
        "trace_id": _hex(ctx.trace_id, 32),
        "span_id": _hex(ctx.span_id, 16),
        "parent_span_id": _hex(span.parent.span_id, 16) if span.parent else None,
        "name": span.name,
        "kind": span.kind.name,
        "start_time_unix_nano": span.start_time,
        "end_time_unix_nano": span.end_time,
        "status_code": span.status.status_code.name,
        "status_message": span.status.description,
        "service_name": (span.resource.attributes.get("service.name") if span.resource else None),
        "scope_name": span.instrumentation_scope.name if span.instrumentation_scope else None,
    }
    for key, (col, typ) in PROMOTED_ATTRIBUTES.items():
        value = None
        if key in attrs:
            fits, converted = _fit(attrs[key], typ)
            if fits:
                value = converted
                del attrs[key]
        row[col] = value
    row["attributes"] = _json({k: list(v) if isinstance(v, tuple) else v for k, v in attrs.items()})
    row["events"] = _json([
        {"name": e.name, "time_unix_nano": e.timestamp,
         "attributes": {k: list(v) if isinstance(v, tuple) else v
                        for k, v in (e.attributes or {}).items()}}
        for e in span.events
    ])
    row["links"] = _json([
        {"trace_id": _hex(link.context.trace_id, 32), "span_id": _hex(link.context.span_id, 16),
         "attributes": dict(link.attributes or {})}
        for link in span.links
    ])
    row["resource"] = _json(dict(span.resource.attributes) if span.resource else None)
    return row


def rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    columns = {f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in SPAN_SCHEMA}
    return pa.Table.from_pydict(columns, schema=SPAN_SCHEMA)


def spans_to_table(spans: Sequence[ReadableSpan]) -> pa.Table:
    return rows_to_table([span_to_row(s) for s in spans])


class ParquetSpanExporter(SpanExporter):
    """Write each exported batch of spans as one Parquet file under ``directory``."""

    def __init__(self, directory: str | os.PathLike[str], *, file_prefix: str = "spans") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._prefix = file_prefix
        self._lock = threading.Lock()
        self._seq = 0
        self._shutdown = False
        self.files_written = 0
        self.spans_written = 0
        self.spans_quarantined = 0

    def _next_name(self, suffix: str) -> Path:
        with self._lock:
            self._seq += 1
            seq = self._seq
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        return self.directory / f"{self._prefix}-{stamp}-{os.getpid()}-{seq:06d}{suffix}"

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        rows, bad = [], []
        for span in spans:
            try:
                rows.append(span_to_row(span))
            except Exception as exc:  # a malformed span must not take the batch with it
                bad.append((span, exc))
        try:
            if rows:
                write_table_atomic(rows_to_table(rows), self._next_name(".parquet"))
                self.files_written += 1
                self.spans_written += len(rows)
            if bad:
                self._quarantine(bad)
        except Exception:
            logger.exception("agl_bridge: writing %d spans to %s failed", len(rows), self.directory)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _quarantine(self, bad: list[tuple[ReadableSpan, Exception]]) -> None:
        qdir = self.directory / "_quarantine"
        qdir.mkdir(exist_ok=True)
        path = self._next_name(".jsonl").name
        fd = os.open(qdir / path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            for span, exc in bad:
                record = {"error": f"{type(exc).__name__}: {exc}", "span": json.loads(span.to_json())}
                f.write(json.dumps(record, default=repr) + "\n")
        self.spans_quarantined += len(bad)
        logger.warning("agl_bridge: quarantined %d malformed span(s) in %s", len(bad), qdir / path)

    def shutdown(self) -> None:
        self._shutdown = True

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
