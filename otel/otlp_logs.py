"""OTLP log requests (protobuf or OTLP/JSON) -> span rows for the events agl-bridge keeps.

The logs counterpart of ``otlp.py``, for ``collect`` (``/v1/logs``, ``LogsService/Export``) and
``import`` (``resourceLogs`` lines). Pure functions, no IO; the function names are those of
``otlp.py`` so the receiver treats both signals alike.

An OpenTelemetry event is a log record with an event name. The ones in ``rows.KEPT_EVENTS``
(``gen_ai.evaluation.result``: rewards that arrive after the fact) become rows through
``rows.event_row``, the same function in-process capture uses; values map as in ``otlp.py``.
Every other record, plain log lines included, is *ignored*: counted, not written and not
rejected (nothing is wrong with it; agl-bridge just has no use for it), so an application that
points all its logs at ``collect`` is not told to retry them.

A kept record that cannot become a row is *rejected*: a quarantine record
``{"error", "log_record", "resource", "scope"}`` in OTLP/JSON (hex ids), and counted in
``partial_success.rejected_log_records``. Rejected: a trace id that is not 16 bytes or a span
id that is not 8 (empty or all-zero means "none": kept), a time beyond int64, an evaluation
without ``gen_ai.evaluation.name`` (the conventions require it; without it nothing says what
the score is for), and in OTLP/JSON a record that does not parse.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ScopeLogs

from agl_bridge.capture import capture_messages
from agl_bridge.otel.otlp import (
    Conversion,
    MalformedRequest,
    _base64_to_hex,
    _hex_to_base64,
    _items,
    _message_json,
    _parse,
    _time,
    any_value,
    attributes,
)
from agl_bridge.otel.rows import KEPT_EVENTS, event_name_of, event_row

_ID_KEYS = ("traceId", "trace_id", "spanId", "span_id")
_SCOPE_LOGS_KEYS = ("scopeLogs", "scope_logs", "instrumentationLibraryLogs")
_RECORDS_KEYS = ("logRecords", "log_records", "logs")


@dataclass
class LogConversion(Conversion):
    """Rows of the kept events, quarantine records, and how many records were ignored."""

    ignored: int = 0
    noun: ClassVar[str] = "log record"

    def extend(self, other: Conversion) -> None:
        super().extend(other)
        self.ignored += getattr(other, "ignored", 0)

    def counts(self) -> dict[str, int]:
        return {"log_records_written": len(self.rows),
                "log_records_rejected": len(self.rejected), "log_records_ignored": self.ignored}

    def response(self) -> ExportLogsServiceResponse:
        """Empty on full success, ``partial_success`` when records were rejected (ignored ones
        were accepted: nothing is to be retried)."""
        response = ExportLogsServiceResponse()
        if self.rejected:
            response.partial_success.rejected_log_records = len(self.rejected)
            response.partial_success.error_message = self.error_message
        return response


def _id(raw: bytes, width: int, label: str) -> str | None:
    if len(raw) not in (0, width):
        raise ValueError(f"invalid {label} {raw.hex()!r} ({len(raw)} bytes, not {width})")
    return raw.hex() if raw.strip(b"\0") else None


def log_row(record: LogRecord, resource: Mapping[str, Any], scope_name: str | None, *,
            keep_text: bool) -> dict[str, Any] | None:
    """One OTLP log record as a row; None if it is not a kept event, ValueError if no row can
    hold it."""
    attrs = attributes(record.attributes)
    name = event_name_of(record.event_name, attrs)
    if name not in KEPT_EVENTS:
        return None
    try:
        trace_id, span_id = _id(record.trace_id, 16, "trace id"), _id(record.span_id, 8, "span id")
        times = _time(record.time_unix_nano), _time(record.observed_time_unix_nano)
    except ValueError as exc:
        raise ValueError(f"event {name!r}: {exc}") from None
    return event_row(
        event_name=name, trace_id=trace_id, span_id=span_id, time_unix_nano=times[0],
        observed_time_unix_nano=times[1], attributes=attrs,
        body=any_value(record.body) if record.HasField("body") else None,
        resource=resource, scope_name=scope_name, keep_text=keep_text)


def request_to_rows(request: ExportLogsServiceRequest) -> LogConversion:
    """Every kept event of a request as a row, or as a quarantine record if it cannot be one."""
    out = LogConversion()
    keep_text = capture_messages()  # AGL_BRIDGE_CAPTURE of this process, once per request
    for resource_logs in request.resource_logs:
        resource = attributes(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            scope_name = scope_logs.scope.name or None
            for record in scope_logs.log_records:
                try:
                    row = log_row(record, resource, scope_name, keep_text=keep_text)
                except ValueError as exc:
                    out.rejected.append(_record(str(exc), log_json(record),
                                                _message_json(resource_logs.resource),
                                                _message_json(scope_logs.scope)))
                    continue
                if row is None:
                    out.ignored += 1
                else:
                    out.rows.append(row)
    return out


def decode_protobuf(body: bytes | bytearray) -> LogConversion:
    """An OTLP/protobuf ``ExportLogsServiceRequest`` body; MalformedRequest if it is not one."""
    try:
        request = ExportLogsServiceRequest.FromString(body)
    except (DecodeError, RecursionError) as exc:
        raise MalformedRequest(f"not an OTLP ExportLogsServiceRequest: {exc}") from None
    return request_to_rows(request)


def decode_json(body: bytes | bytearray | str) -> LogConversion:
    """An OTLP/JSON ``ExportLogsServiceRequest``: an HTTP body, or a line of a Collector file."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise MalformedRequest(f"not JSON: {exc}") from None
    return json_to_rows(obj)


def json_to_rows(obj: Any) -> LogConversion:
    """An OTLP/JSON logs request already parsed by ``json.loads``."""
    request, rejected = parse_json_request(obj)
    out = request_to_rows(request)
    out.rejected[:0] = rejected
    return out


def parse_json_request(obj: Any) -> tuple[ExportLogsServiceRequest, list[dict[str, Any]]]:
    """OTLP/JSON -> the protobuf request, plus quarantine records for records that would not
    parse (each is parsed alone, hex ids made base64 first); anything wrong outside the records
    makes the whole request MalformedRequest."""
    if not isinstance(obj, dict):
        raise MalformedRequest(f"an OTLP/JSON request is a JSON object, got {type(obj).__name__}")
    request = ExportLogsServiceRequest()
    rejected: list[dict[str, Any]] = []
    for rl in _items(obj, "resourceLogs", "resource_logs"):
        scopes = _items(rl, *_SCOPE_LOGS_KEYS)
        pb_rl = request.resource_logs.add()
        _parse({k: v for k, v in rl.items() if k not in _SCOPE_LOGS_KEYS}, pb_rl)
        for sl in scopes:
            records = _items(sl, *_RECORDS_KEYS)
            legacy = {"scope": sl["instrumentationLibrary"]} \
                if "instrumentationLibrary" in sl else {}
            pb_sl: ScopeLogs = pb_rl.scope_logs.add()
            _parse({**{k: v for k, v in sl.items() if k not in (*_RECORDS_KEYS,
                                                                "instrumentationLibrary")},
                    **legacy}, pb_sl)
            for record in records:
                try:
                    parsed = LogRecord()
                    json_format.ParseDict(_ids_to_base64(record), parsed,
                                          ignore_unknown_fields=True)
                except Exception as exc:
                    rejected.append(_record(f"log record not parsable: {exc}", record,
                                            rl.get("resource"),
                                            sl.get("scope", legacy.get("scope"))))
                    continue
                pb_sl.log_records.append(parsed)
    return request, rejected


def _ids_to_base64(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ValueError(f"a log record is a JSON object, got {type(record).__name__}")
    return {k: _hex_to_base64(k, v) if k in _ID_KEYS else v for k, v in record.items()}


def log_json(record: LogRecord) -> dict[str, Any]:
    """A log record as OTLP/JSON (hex ids), as the Collector's file exporter writes it."""
    obj = _message_json(record)
    for key in ("traceId", "spanId"):
        if key in obj:
            obj[key] = _base64_to_hex(obj[key])
    return obj


def _record(error: str, record: Any, resource: Any, scope: Any) -> dict[str, Any]:
    return {"error": error, "log_record": record, "resource": resource, "scope": scope}
