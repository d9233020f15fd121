"""In-process capture of evaluation events sent through the OpenTelemetry logs API.

An application that scores an answer the standard way emits the event
``gen_ai.evaluation.result`` as a log record::

    from opentelemetry._logs import LogRecord, get_logger
    from agl_bridge import semconv as sc  # or the names themselves, as docs/ spells them
    get_logger("my.app").emit(LogRecord(event_name=sc.GEN_AI_EVALUATION_RESULT, attributes={
        sc.GEN_AI_EVALUATION_NAME: "helpful", sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0}))

Emitted inside the evaluated span (or with its context), the record carries that span's trace
and span ids, which is how conversion finds what it scores. Where agl-bridge capture writes span
Parquet (``AGL_BRIDGE_AUTO=1`` or ``configure_tracing(parquet_dir=...)``), ``capture_logs`` puts
an ``EvaluationLogProcessor`` on the process's logger provider, writing such events as rows
through the span writer (``rows.log_record_to_row``, the mapping ``collect`` uses too).

The provider is handled as ``setup.py`` handles the tracer provider: an SDK ``LoggerProvider``
the application already set gets our processor; otherwise we install one, and if the
application sets its own later (OpenTelemetry keeps the first), its processors are added to
ours, so its exporters still receive what is emitted through the global API.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from opentelemetry import _logs
from opentelemetry.sdk._logs import LoggerProvider, LogRecordProcessor
from opentelemetry.sdk.resources import Resource

from agl_bridge.capture import capture_messages
from agl_bridge.otel.parquet_writer import SpanParquetWriter
from agl_bridge.otel.rows import log_record_to_row

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_installed: LoggerProvider | None = None  # the provider we installed, if we did
_original_set = _logs.set_logger_provider


class EvaluationLogProcessor(LogRecordProcessor):
    """Writes the events agl-bridge keeps (``rows.KEPT_EVENTS``) as span rows.

    In the emitting thread, not batched: evaluations are few (one per scored answer at most),
    every other record costs one name check, and a score is then durable when ``emit`` returns,
    as ``agl_bridge.feedback`` promises. Nothing raised here reaches the application: a record
    no row can hold is quarantined, a failed write is logged.
    """

    def __init__(self, writer: SpanParquetWriter) -> None:
        self.writer = writer

    def on_emit(self, log_record: Any) -> None:
        try:
            row = log_record_to_row(log_record, keep_text=capture_messages())
            if row is not None:
                self.writer.write_rows([row])
        except ValueError as exc:  # a kept event no row can hold
            self._quarantine(str(exc), log_record)
        except Exception:  # the writer is closed (exit) or failing: never the app's problem
            logger.warning("agl_bridge: an evaluation event could not be written to %s",
                           self.writer.directory, exc_info=True)

    emit = on_emit  # what SDKs before ``on_emit`` call, with a ``LogData``

    def _quarantine(self, error: str, data: Any) -> None:
        try:
            self.writer.quarantine([{"error": error, "log_record": _record_json(data)}])
        except Exception:
            logger.warning("agl_bridge: could not quarantine an evaluation event (%s)", error,
                           exc_info=True)

    def shutdown(self) -> None:
        """Nothing to do: the writer belongs to the span exporter, which closes it."""

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # every record is written when emitted


def _record_json(data: Any) -> Any:
    for obj in (data, getattr(data, "log_record", None)):
        to_json = getattr(obj, "to_json", None)
        if callable(to_json):
            try:
                return json.loads(to_json())
            except Exception:
                pass
    return {"repr": repr(data)}


def capture_logs(writer: SpanParquetWriter) -> EvaluationLogProcessor:
    """Evaluation events emitted in this process go to ``writer`` from now on (see the module
    docstring for which logger provider carries them)."""
    global _installed
    processor = EvaluationLogProcessor(writer)
    with _lock:
        current = _logs.get_logger_provider()
        if not isinstance(current, LoggerProvider):
            # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, as the tracer
            # provider agl-bridge installs does
            ours = LoggerProvider(resource=Resource.create({}))
            _original_set(ours)
            current = _logs.get_logger_provider()
            if current is ours:
                _installed = ours
                _logs.set_logger_provider = _on_set  # type: ignore[assignment]
        if isinstance(current, LoggerProvider):
            current.add_log_record_processor(processor)
        else:  # another, non-SDK provider won a race: nothing of ours can join it
            logger.warning("agl_bridge: the logger provider is %s, not the SDK's; evaluation "
                           "events sent through the logs API are not captured",
                           type(current).__name__)
    return processor


def _on_set(provider: Any) -> None:
    """``set_logger_provider`` once ours is installed: OpenTelemetry refuses the application's
    provider, so its processors join ours (its resource and limits are not used)."""
    _original_set(provider)
    ours = _installed
    if ours is not None and isinstance(provider, LoggerProvider) and provider is not ours:
        ours.add_log_record_processor(provider._multi_log_record_processor)
        logger.warning("agl_bridge: the application set a logger provider after agl-bridge "
                       "installed its own; its log record processors now receive our "
                       "provider's records")
