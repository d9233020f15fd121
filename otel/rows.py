"""Span rows (``agl_bridge.schema.SPAN_SCHEMA``) from any source: SDK spans, OTLP, OTLP/JSON.

``build_row`` is the one place a span becomes a row, so spans captured in-process, received
over OTLP and imported from collector files land identically. ``event_row`` is the one place
an OpenTelemetry log record (an event) becomes a row, whichever way it came;
``evaluation_row`` makes the row of an evaluation record (``agl_bridge.feedback``).
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import os
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from opentelemetry.sdk.trace import ReadableSpan

from agl_bridge import semconv as sc
from agl_bridge.schema import PROMOTED_ATTRIBUTES, SPAN_SCHEMA

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FLOAT_EXACT_INT = 2**53  # larger ints do not survive a float64 column


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _fit(value: Any, typ: pa.DataType) -> tuple[bool, Any]:
    """(fits, column value) for a promoted attribute; no coercion that could lose information."""
    if pa.types.is_string(typ):
        return isinstance(value, str), value
    if pa.types.is_int32(typ):
        return _is_int(value) and _INT32_MIN <= value <= _INT32_MAX, value
    if pa.types.is_float64(typ):
        return (isinstance(value, float)
                or (_is_int(value) and abs(value) <= _FLOAT_EXACT_INT)), value
    if pa.types.is_list(typ) and isinstance(value, (tuple, list)):
        # whole-list checks in C (set of types, min, max): token id lists are hundreds long and
        # this runs for every span exported
        if not value:
            return True, []
        kinds = set(map(type, value))
        if pa.types.is_int32(typ.value_type):
            ok = kinds == {int} and _INT32_MIN <= min(value) and max(value) <= _INT32_MAX
        else:
            ok = kinds <= {float, int} and (
                int not in kinds or max(abs(x) for x in value if type(x) is int)
                <= _FLOAT_EXACT_INT)
        return ok, list(value)
    return False, None


def _plain(attrs: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in (attrs or {}).items()}


def _json(obj: Any) -> str | None:
    return json.dumps(obj, separators=(",", ":")) if obj else None


def build_row(*, trace_id: str, span_id: str, parent_span_id: str | None, name: str, kind: str,
              start_time_unix_nano: int | None, end_time_unix_nano: int | None,
              status_code: str, status_message: str | None, attributes: Mapping[str, Any] | None,
              events: Sequence[Mapping[str, Any]] = (), links: Sequence[Mapping[str, Any]] = (),
              resource: Mapping[str, Any] | None = None, scope_name: str | None = None
              ) -> dict[str, Any]:
    """One row of SPAN_SCHEMA. Ids are lowercase hex (32 and 16 digits). Raises ValueError on a
    span that no row can hold (no name, bad ids): callers quarantine it."""
    if not isinstance(name, str):
        raise ValueError(f"span name must be a string, got {type(name).__name__}")
    for label, ident, width in (("trace id", trace_id, 32), ("span id", span_id, 16)):
        if not (isinstance(ident, str) and len(ident) == width and ident.strip("0")):
            raise ValueError(f"span {name!r}: invalid {label} {ident!r}")
    for label, ns in (("start", start_time_unix_nano), ("end", end_time_unix_nano)):
        if ns is not None and not (_is_int(ns) and _INT64_MIN <= ns <= _INT64_MAX):
            raise ValueError(f"span {name!r}: {label} time {ns!r} is not an int64 of nanoseconds")
    attrs = _plain(attributes)
    resource = dict(resource or {})
    service = resource.get("service.name")
    row: dict[str, Any] = {
        "trace_id": trace_id, "span_id": span_id, "parent_span_id": parent_span_id or None,
        "name": name, "kind": kind, "start_time_unix_nano": start_time_unix_nano,
        "end_time_unix_nano": end_time_unix_nano, "status_code": status_code,
        "status_message": status_message or None,
        # a non-string service name stays in the resource JSON; the column holds strings only
        "service_name": service if isinstance(service, str) else None, "scope_name": scope_name,
    }
    for key, (col, typ) in PROMOTED_ATTRIBUTES.items():
        value: Any = None
        if key in attrs:
            fits, converted = _fit(attrs[key], typ)
            if fits:
                value = converted
                del attrs[key]
        row[col] = value
    row["attributes"] = _json(attrs)
    row["events"] = _json([dict(e, attributes=_plain(e.get("attributes"))) for e in events])
    row["links"] = _json([dict(link, attributes=_plain(link.get("attributes"))) for link in links])
    row["resource"] = _json(_plain(resource))
    return row


def _hex(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def span_to_row(span: ReadableSpan) -> dict[str, Any]:
    """An OpenTelemetry SDK span as a row."""
    ctx = span.context
    if ctx is None:
        raise ValueError(f"span {span.name!r} has no context")
    return build_row(
        trace_id=_hex(ctx.trace_id, 32), span_id=_hex(ctx.span_id, 16),
        parent_span_id=_hex(span.parent.span_id, 16) if span.parent else None,
        name=span.name, kind=span.kind.name, start_time_unix_nano=span.start_time,
        end_time_unix_nano=span.end_time, status_code=span.status.status_code.name,
        status_message=span.status.description, attributes=span.attributes,
        events=[{"name": e.name, "time_unix_nano": e.timestamp, "attributes": e.attributes}
                for e in span.events],
        links=[{"trace_id": _hex(link.context.trace_id, 32),
                "span_id": _hex(link.context.span_id, 16), "attributes": link.attributes}
               for link in span.links],
        resource=span.resource.attributes if span.resource else None,
        scope_name=span.instrumentation_scope.name if span.instrumentation_scope else None,
    )


def evaluation_row(attributes: dict[str, Any], *, service_name: str | None = None,
                   time_unix_nano: int | None = None) -> dict[str, Any]:
    """An evaluation record (``agl_bridge.evaluations.evaluation_attributes``) as a span row of
    its own (a fresh trace; none of the target's)."""
    now = time_unix_nano if time_unix_nano is not None else time.time_ns()
    service = service_name or os.environ.get("OTEL_SERVICE_NAME") or "agl_bridge.feedback"
    return build_row(trace_id=secrets.token_hex(16), span_id=secrets.token_hex(8),
                     parent_span_id=None, name=sc.GEN_AI_EVALUATION_RESULT, kind="INTERNAL",
                     start_time_unix_nano=now, end_time_unix_nano=now, status_code="UNSET",
                     status_message=None, attributes=attributes,
                     resource={"service.name": service}, scope_name=sc.INSTRUMENTATION_SCOPE)


_DAY_NS = 86_400 * 10**9
_EPOCH = _dt.date(1970, 1, 1)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def partition_of(start_time_unix_nano: int | None, service_name: str | None) -> str:
    """The hive partition of a row: ``date=YYYY-MM-DD/service=NAME``, the UTC day of the
    span's start (now if it has none) and its service name made safe for a path."""
    ns = start_time_unix_nano or time.time_ns()
    day = _EPOCH + _dt.timedelta(days=ns // _DAY_NS)
    service = _UNSAFE.sub("_", service_name or "unknown")[:100]
    return f"date={day.isoformat()}/service={service}"


def rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    columns = {f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in SPAN_SCHEMA}
    return pa.Table.from_pydict(columns, schema=SPAN_SCHEMA)


# -- log records (events) ----------------------------------------------------------------------
# The events kept as rows. Only evaluations: they are what conversion reads (rewards after the
# fact). Other events are left out on purpose: an application's log stream (Python logging
# bridged to OpenTelemetry) would flood the training store, and GenAI events such as
# gen_ai.client.inference.operation.details carry message content that the capture level keeps
# out of spans.
KEPT_EVENTS: frozenset[str] = frozenset({sc.GEN_AI_EVALUATION_RESULT})


def event_name_of(event_name: str | None, attributes: Mapping[str, Any] | None) -> str | None:
    """A log record's event name: its ``event_name`` field, or the ``event.name`` attribute
    SDKs before that field wrote; None for a plain log line."""
    if event_name:
        return event_name
    legacy = (attributes or {}).get(sc.EVENT_NAME)
    return legacy if isinstance(legacy, str) and legacy else None


def event_row(*, event_name: str, trace_id: str | None, span_id: str | None,
              time_unix_nano: int | None, observed_time_unix_nano: int | None,
              attributes: Mapping[str, Any] | None, body: Any = None,
              resource: Mapping[str, Any] | None = None, scope_name: str | None = None,
              keep_text: bool = False) -> dict[str, Any]:
    """One log record (an event) as a row of SPAN_SCHEMA; ValueError if no row can hold it.

    ``trace_id``/``span_id``: the record's trace context as hex, None when it has none.
    Values are already mapped as ``otlp.any_value`` maps them (``log_record_to_row`` does it for
    SDK records), so one record lands as the same row in-process, over OTLP and from files.

    * name: the event name; kind ``EVENT``; start = end = the record's time (observed time if
      it has none);
    * ``parent_span_id``: the record's span id, the span it was emitted in (the evaluated span);
    * ids: derived from (trace id, span id, time, event name, attributes): the same record sent
      twice is the same row, which conversion counts once. A record without a trace gets a trace
      id of its own, derived the same way (never one of an episode's);
    * the body and ``gen_ai.evaluation.explanation`` are free text: kept only when
      ``keep_text`` (the ``messages`` capture level), the body as ``agl_bridge.log.body``.
    """
    if not isinstance(event_name, str) or not event_name:
        raise ValueError("log record has no event name")
    for label, value, width in (("trace id", trace_id, 32), ("span id", span_id, 16)):
        if value is not None and not (isinstance(value, str) and len(value) == width
                                      and value.strip("0")):
            raise ValueError(f"event {event_name!r}: invalid {label} {value!r}")
    time_ns = time_unix_nano or observed_time_unix_nano or None
    attrs = dict(attributes or {})
    if event_name == sc.GEN_AI_EVALUATION_RESULT:
        name = attrs.get(sc.GEN_AI_EVALUATION_NAME)
        if not (isinstance(name, str) and name) and sc.EVALUATION_TARGET not in attrs:
            raise ValueError(f"event {event_name!r} has no {sc.GEN_AI_EVALUATION_NAME} "
                             f"(required: what was evaluated for)")
    digest = hashlib.sha256(json.dumps(
        [trace_id or "", span_id or "", time_ns, event_name, attrs], sort_keys=True,
        separators=(",", ":"), default=repr).encode()).hexdigest()
    if not keep_text:
        attrs.pop(sc.GEN_AI_EVALUATION_EXPLANATION, None)
    elif body is not None:
        attrs[sc.LOG_BODY] = body
    return build_row(
        trace_id=trace_id or digest[:32], span_id=digest[32:48], parent_span_id=span_id,
        name=event_name, kind=sc.EVENT_SPAN_KIND, start_time_unix_nano=time_ns,
        end_time_unix_nano=time_ns, status_code="UNSET", status_message=None,
        attributes=attrs, resource=resource, scope_name=scope_name)


def _sdk_value(value: Any) -> Any:
    """An SDK attribute or body value as OTLP would carry it (``otlp.any_value``): bytes as
    base64 text, sequences as lists, mappings as dicts."""
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, (list, tuple)):
        return [_sdk_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _sdk_value(v) for k, v in value.items()}
    return value


def log_record_to_row(data: Any, *, keep_text: bool = False) -> dict[str, Any] | None:
    """An SDK log record as a row, or None if it is not an event agl-bridge keeps.

    ``data``: what a ``LogRecordProcessor`` or ``LogExporter`` is given: a ``ReadWriteLogRecord``
    or ``ReadableLogRecord`` (SDK 1.35+), or a ``LogData`` (older SDKs; its record holds the
    resource). The record carries the span context current when it was emitted.
    """
    record = getattr(data, "log_record", data)
    attributes = {k: _sdk_value(v) for k, v in (record.attributes or {}).items()}
    name = event_name_of(getattr(record, "event_name", None), attributes)
    if name not in KEPT_EVENTS:
        return None
    resource = getattr(data, "resource", None) or getattr(record, "resource", None)
    scope = getattr(data, "instrumentation_scope", None)
    trace_id, span_id = getattr(record, "trace_id", None), getattr(record, "span_id", None)
    return event_row(
        event_name=name, trace_id=_hex(trace_id, 32) if trace_id else None,
        span_id=_hex(span_id, 16) if span_id else None,
        time_unix_nano=record.timestamp, observed_time_unix_nano=record.observed_timestamp,
        attributes=attributes, body=_sdk_value(record.body), keep_text=keep_text,
        resource=resource.attributes if resource is not None else None,
        scope_name=scope.name if scope is not None else None)
