"""Span rows (``agl_bridge.schema.SPAN_SCHEMA``) from any source: SDK spans, OTLP, OTLP/JSON.

``build_row`` is the one place a span becomes a row, so spans captured in-process, received
over OTLP and imported from collector files land identically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from opentelemetry.sdk.trace import ReadableSpan

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
    for label, value, width in (("trace id", trace_id, 32), ("span id", span_id, 16)):
        if not (isinstance(value, str) and len(value) == width and value.strip("0")):
            raise ValueError(f"span {name!r}: invalid {label} {value!r}")
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
        value = None
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


def rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    columns = {f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in SPAN_SCHEMA}
    return pa.Table.from_pydict(columns, schema=SPAN_SCHEMA)
