"""OTLP trace requests (protobuf or OTLP/JSON) -> span rows: what ``collect`` and ``import`` share.

Pure functions, no IO. Every OTLP span goes through ``rows.build_row`` with the same inputs
``rows.span_to_row`` gives it for an SDK span, so a span received over OTLP or imported from a
Collector file lands as the row it would have been had it been captured in-process.

Value mapping (OTLP ``AnyValue`` -> the Python value ``build_row`` sees):

* string, bool, int, double -> ``str``, ``bool``, ``int``, ``float``; an empty AnyValue -> ``None``
  (the SDK encodes a ``None`` inside a list that way);
* array -> ``list`` of the mapped elements, nested arrays nested; ints stay ints, so token ids
  fill the typed ``list<int32>`` columns and never become floats;
* kvlist -> ``dict`` (a JSON object in the ``attributes`` column; a repeated key keeps its last
  value). The SDK cannot make these, other SDKs and the Collector can;
* bytes -> a standard base64 ``str``, the way OTLP/JSON writes bytes (JSON has no bytes type;
  Python's SDK turns bytes attributes into text before they are exported).

Span fields: ids -> lowercase hex; an empty or all-zero parent id -> ``None`` (a root span);
kind -> the SDK names ``INTERNAL`` ... ``CONSUMER`` (unspecified or unknown -> ``INTERNAL``);
status -> ``UNSET``/``OK``/``ERROR`` (unknown -> ``UNSET``); a time of 0 (proto3 for "not set")
-> ``None``; resource attributes -> ``resource``; scope name -> ``scope_name``; events and links
as ``span_to_row`` writes them. Not kept, as ``span_to_row`` does not keep them either (the row
has no column for them): trace state, flags, dropped-item counts, scope version and attributes,
schema URLs.

A span that cannot become a row is *rejected*, never dropped: it comes back as a quarantine
record ``{"error", "span", "resource", "scope"}`` whose parts are OTLP/JSON, so the record can be
put back into a request. Rejected: bad trace or span ids, a parent id that is not 8 bytes, an
empty name, and times beyond int64. Values that do not fit a promoted column (a non-string
``service.name``, an int too large for a float64 column) are not rejected: ``build_row`` keeps
them in the JSON columns, as it does for in-process spans.

OTLP/JSON is not proto3 JSON: trace and span ids are hex, not base64 (enums as ints and int64 as
strings or numbers, ``ParseDict`` already accepts). Each span is fixed up (hex -> base64) and parsed
on its own, so one malformed span is rejected alone; the request then takes the protobuf path.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from agl_bridge.otel.rows import build_row

# OTLP enum numbers -> the names the SDK path writes (SpanKind.name, StatusCode.name)
SPAN_KINDS: dict[int, str] = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_CODES: dict[int, str] = {0: "UNSET", 1: "OK", 2: "ERROR"}

_INT64_MAX = 2**63 - 1
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")
_MAX_ERRORS_IN_MESSAGE = 3
C = TypeVar("C", bound="Conversion")
#: ``(item, resource attributes, scope name) -> row``; None: an item left out on purpose
RowOf = Callable[[Any, dict[str, Any], str | None], dict[str, Any] | None]


class MalformedRequest(ValueError):
    """The payload as a whole is not an OTLP trace request (answered 400 / INVALID_ARGUMENT)."""


@dataclass
class Conversion:
    """Rows ready for ``SpanParquetWriter.write_rows`` and quarantine records for the rest."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    ignored: int = 0  # items left out on purpose (log records that are not kept events)
    noun: ClassVar[str] = "span"  # what the request carries, for messages

    def counts(self) -> dict[str, int]:
        """Increments of ``ReceiverStats`` for this request."""
        return {"spans_written": len(self.rows), "spans_rejected": len(self.rejected)}

    @property
    def error_message(self) -> str:
        """OTLP ``partial_success.error_message``: how many were rejected and the first reasons."""
        if not self.rejected:
            return ""
        reasons = "; ".join(r["error"] for r in self.rejected[:_MAX_ERRORS_IN_MESSAGE])
        more = "; ..." if len(self.rejected) > _MAX_ERRORS_IN_MESSAGE else ""
        return f"{len(self.rejected)} {self.noun}(s) rejected and quarantined: {reasons}{more}"

    def response(self) -> ExportTraceServiceResponse:
        """The OTLP answer: empty on full success, ``partial_success`` when spans were rejected."""
        response = ExportTraceServiceResponse()
        if self.rejected:
            response.partial_success.rejected_spans = len(self.rejected)
            response.partial_success.error_message = self.error_message
        return response


@dataclass(frozen=True)
class Shape:
    """Where a signal's items sit in its request: protobuf fields (resource, scope, item), the
    OTLP/JSON spellings of each level (camelCase first), and the item's hex id keys."""

    request: type[Any]  # ExportTraceServiceRequest, ExportLogsServiceRequest
    item: type[Any]  # Span, LogRecord
    fields: tuple[str, str, str]  # ("resource_spans", "scope_spans", "spans")
    resource_keys: tuple[str, ...]
    scope_keys: tuple[str, ...]
    item_keys: tuple[str, ...]
    id_keys: tuple[str, ...]
    noun: str  # in messages, and its snake_case is the quarantine record's key for the item
    links: bool = False  # items hold links, whose ids are hex too


SPANS = Shape(ExportTraceServiceRequest, Span, ("resource_spans", "scope_spans", "spans"),
              ("resourceSpans", "resource_spans"),
              ("scopeSpans", "scope_spans", "instrumentationLibrarySpans"), ("spans",),
              ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"),
              "span", links=True)


# -- values ------------------------------------------------------------------------------------
def any_value(value: AnyValue) -> Any:
    """One OTLP AnyValue as a JSON-able Python value (see the module docstring)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return getattr(value, kind)


def attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def _time(ns: int) -> int | None:
    if ns > _INT64_MAX:
        raise ValueError(f"time {ns} ns does not fit int64")
    return ns or None


def _parent(span: Span) -> str | None:
    parent = span.parent_span_id
    if len(parent) not in (0, 8):
        raise ValueError(f"span {span.name!r}: invalid parent span id {parent.hex()!r}")
    return parent.hex() if parent.strip(b"\0") else None


def span_row(span: Span, resource: Mapping[str, Any], scope_name: str | None) -> dict[str, Any]:
    """One OTLP span as a row of SPAN_SCHEMA; ValueError if no row can hold it."""
    if not span.name:
        raise ValueError(f"span {span.span_id.hex()!r} has no name")
    row = build_row(
        trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), parent_span_id=_parent(span),
        name=span.name, kind=SPAN_KINDS.get(span.kind, "INTERNAL"),
        start_time_unix_nano=_time(span.start_time_unix_nano),
        end_time_unix_nano=_time(span.end_time_unix_nano),
        status_code=STATUS_CODES.get(span.status.code, "UNSET"),
        status_message=span.status.message, attributes=attributes(span.attributes),
        events=[{"name": e.name, "time_unix_nano": e.time_unix_nano,
                 "attributes": attributes(e.attributes)} for e in span.events],
        links=[{"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex(),
                "attributes": attributes(link.attributes)} for link in span.links],
        resource=resource, scope_name=scope_name,
    )
    return row


# -- requests ----------------------------------------------------------------------------------
def request_to_rows(request: ExportTraceServiceRequest) -> Conversion:
    """Every span of a request as a row, or as a quarantine record if it cannot be one."""
    return convert(request, SPANS, span_row, Conversion())


def convert(request: Any, shape: Shape, row_of: RowOf, out: C) -> C:
    """Every item of a protobuf request as ``row_of(item, resource, scope name)`` (None: left
    out, counted as ignored), or as a quarantine record when it raises ValueError."""
    resource_field, scope_field, item_field = shape.fields
    for group in getattr(request, resource_field):
        resource = attributes(group.resource.attributes)
        for scoped in getattr(group, scope_field):
            scope_name = scoped.scope.name or None
            for item in getattr(scoped, item_field):
                try:
                    row = row_of(item, resource, scope_name)
                except ValueError as exc:
                    out.rejected.append(_record(shape, str(exc), otlp_json(item),
                                                _message_json(group.resource),
                                                _message_json(scoped.scope)))
                    continue
                if row is None:
                    out.ignored += 1
                else:
                    out.rows.append(row)
    return out


def decode_protobuf(body: bytes | bytearray) -> Conversion:
    """An OTLP/protobuf ``ExportTraceServiceRequest`` body; MalformedRequest if it is not one."""
    return request_to_rows(parse_protobuf(body, SPANS))


def parse_protobuf(body: bytes | bytearray, shape: Shape) -> Any:
    try:
        return shape.request.FromString(body)
    except (DecodeError, RecursionError) as exc:
        raise MalformedRequest(f"not an OTLP {shape.request.__name__}: {exc}") from None


def decode_json(body: bytes | bytearray | str) -> Conversion:
    """An OTLP/JSON ``ExportTraceServiceRequest``: an HTTP body, or a line of a Collector file."""
    return json_to_rows(loads(body))


def loads(body: bytes | bytearray | str) -> Any:
    """``json.loads``, with MalformedRequest for what is not JSON."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise MalformedRequest(f"not JSON: {exc}") from None


def json_to_rows(obj: Any) -> Conversion:
    """An OTLP/JSON request already parsed by ``json.loads``."""
    request, rejected = parse_json_request(obj, SPANS)
    out = request_to_rows(request)
    out.rejected[:0] = rejected
    return out


def parse_json_request(obj: Any, shape: Shape) -> tuple[Any, list[dict[str, Any]]]:
    """OTLP/JSON -> the protobuf request, plus quarantine records for items that would not parse.

    Items are parsed one by one (after hex ids become base64) so a bad one is rejected alone;
    anything wrong outside the items makes the whole request MalformedRequest.
    """
    if not isinstance(obj, dict):
        raise MalformedRequest(f"an OTLP/JSON request is a JSON object, got {type(obj).__name__}")
    request = shape.request()
    rejected: list[dict[str, Any]] = []
    resource_field, scope_field, item_field = shape.fields
    for group in _items(obj, *shape.resource_keys):
        scopes = _items(group, *shape.scope_keys)
        pb_group = getattr(request, resource_field).add()
        _parse({k: v for k, v in group.items() if k not in shape.scope_keys}, pb_group)
        for scoped in scopes:
            items = _items(scoped, *shape.item_keys)
            # OTLP before InstrumentationScope (old Collector files) said instrumentationLibrary
            legacy = {"scope": scoped["instrumentationLibrary"]} \
                if "instrumentationLibrary" in scoped else {}
            pb_scoped = getattr(pb_group, scope_field).add()
            _parse({**{k: v for k, v in scoped.items()
                       if k not in (*shape.item_keys, "instrumentationLibrary")}, **legacy},
                   pb_scoped)
            for item in items:
                try:
                    parsed = shape.item()
                    json_format.ParseDict(_ids_to_base64(item, shape), parsed,
                                          ignore_unknown_fields=True)
                except Exception as exc:
                    rejected.append(_record(shape, f"{shape.noun} not parsable: {exc}", item,
                                            group.get("resource"),
                                            scoped.get("scope", legacy.get("scope"))))
                    continue
                getattr(pb_scoped, item_field).append(parsed)
    return request, rejected


def _items(obj: Any, *keys: str) -> list[Any]:
    if not isinstance(obj, dict):
        raise MalformedRequest(f"expected a JSON object, got {type(obj).__name__}")
    for key in keys:
        if obj.get(key) is not None:
            value = obj[key]
            if not isinstance(value, list):
                raise MalformedRequest(f"{key!r} must be a list, got {type(value).__name__}")
            return value
    return []


def _parse(obj: dict[str, Any], message: Any) -> None:
    try:
        json_format.ParseDict(obj, message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise MalformedRequest(f"not OTLP/JSON: {exc}") from None


def _ids_to_base64(item: Any, shape: Shape) -> dict[str, Any]:
    """OTLP/JSON item (hex ids) -> proto3 JSON item (base64 ids), links included."""
    if not isinstance(item, dict):
        raise ValueError(f"a {shape.noun} is a JSON object, got {type(item).__name__}")
    keys = shape.id_keys
    fixed = {k: _hex_to_base64(k, v) if k in keys else v for k, v in item.items()}
    links = fixed.get("links")
    if shape.links and isinstance(links, list):
        fixed["links"] = [{k: _hex_to_base64(k, v) if k in keys else v for k, v in link.items()}
                          if isinstance(link, dict) else link for link in links]
    return fixed


def _hex_to_base64(key: str, value: Any) -> str:
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        raise ValueError(f"{key} {value!r} is not a hex string")
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


# -- back to OTLP/JSON (quarantine records) ----------------------------------------------------
def _message_json(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, use_integers_for_enums=True)


def otlp_json(item: Any) -> dict[str, Any]:
    """A span or log record as OTLP/JSON (hex ids, enums as ints), as the Collector's file
    exporter writes it."""
    obj = _message_json(item)
    for holder in (obj, *obj.get("links", ())):
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in holder:
                holder[key] = _base64_to_hex(holder[key])
    return obj


def _base64_to_hex(value: str) -> str:
    try:
        return base64.b64decode(value).hex()
    except (binascii.Error, ValueError):
        return value


def _record(shape: Shape, error: str, item: Any, resource: Any, scope: Any) -> dict[str, Any]:
    return {"error": error, shape.noun.replace(" ", "_"): item, "resource": resource,
            "scope": scope}
