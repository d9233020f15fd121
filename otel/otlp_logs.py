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

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from agl_bridge.capture import capture_messages
from agl_bridge.otel.otlp import (
    Conversion,
    Shape,
    _time,
    any_value,
    attributes,
    convert,
    loads,
    parse_json_request,
    parse_protobuf,
)
from agl_bridge.otel.rows import KEPT_EVENTS, event_name_of, event_row

LOGS = Shape(ExportLogsServiceRequest, LogRecord, ("resource_logs", "scope_logs", "log_records"),
             ("resourceLogs", "resource_logs"),
             ("scopeLogs", "scope_logs", "instrumentationLibraryLogs"),
             ("logRecords", "log_records", "logs"), ("traceId", "trace_id", "spanId", "span_id"),
             "log record")


@dataclass
class LogConversion(Conversion):
    """Rows of the kept events, quarantine records, and how many records were ignored."""

    noun: ClassVar[str] = "log record"

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
    # AGL_BRIDGE_CAPTURE of this process, once per request
    return convert(request, LOGS, partial(log_row, keep_text=capture_messages()),
                   LogConversion())


def decode_protobuf(body: bytes | bytearray) -> LogConversion:
    """An OTLP/protobuf ``ExportLogsServiceRequest`` body; MalformedRequest if it is not one."""
    return request_to_rows(parse_protobuf(body, LOGS))


def decode_json(body: bytes | bytearray | str) -> LogConversion:
    """An OTLP/JSON ``ExportLogsServiceRequest``: an HTTP body, or a line of a Collector file."""
    return json_to_rows(loads(body))


def json_to_rows(obj: Any) -> LogConversion:
    """An OTLP/JSON logs request already parsed by ``json.loads``."""
    request, rejected = parse_json_request(obj, LOGS)
    out = request_to_rows(request)
    out.rejected[:0] = rejected
    return out
