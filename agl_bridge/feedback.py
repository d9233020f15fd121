"""Rewards that arrive after the fact: ``agl_bridge.feedback(target, value)`` from any process.

Production rewards rarely exist while an episode runs: a user's thumbs-up, a closed ticket, an
annotator's score arrive minutes or days later, from another process. ``feedback`` records such
a score as an evaluation in OpenTelemetry's standard form (``gen_ai.evaluation.result``:
``gen_ai.evaluation.name``, ``.score.value``, ``.score.label``, ``.explanation``), with the id
of what it scores, and the converter joins it to its episode whatever file, service, process
or day it landed in.

``target`` is an id the application already has: an episode id (``current_episode_id()`` where
the episode ran), an OpenTelemetry trace id (32 hex digits; ``current_trace_id()``) or a
``gen_ai.response.id`` (the id the OpenAI API returns, which apps often log or show). A prefix
``episode:``, ``trace:`` or ``response:`` says which; without one the converter tries them in
that order. ``agent`` scopes the score to one agent of the episode.

Where it goes: to ``out`` (a span Parquet directory) when given; else through this process's
capture when agl-bridge capture is on (Parquet and/or OTLP, as configured); else to
``$AGL_BRIDGE_PARQUET_DIR``. A direct write is durable when ``feedback`` returns (the span
Parquet write-ahead log) and visible to conversion within ``FEEDBACK_FILE_AGE_S`` seconds, at
``flush_feedback()`` or at exit. Nothing else is needed in the calling process.

The record's attributes are made and checked in ``agl_bridge.evaluations``; this module sends
them, through ``agl_bridge.otel`` (imported on call: ``import agl_bridge`` loads no SDK and no
pyarrow).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from agl_bridge import semconv as sc
from agl_bridge.evaluations import evaluation_attributes

FEEDBACK_FILE_AGE_S = 5.0
_writers: dict[str, Any] = {}
_writers_lock = threading.Lock()


def current_episode_id() -> str | None:
    """The episode this code runs in (``agl_bridge.episode``), for feedback later."""
    from agl_bridge.scope import current_scope

    episode = current_scope().get("episode_id")
    return episode if isinstance(episode, str) else None


def current_trace_id() -> str | None:
    """The current OpenTelemetry trace id as 32 hex digits, or None outside a span."""
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def feedback(target: str, value: float | Mapping[str, float], *, name: str | None = None,
             kind: str = sc.RewardKind.HUMAN, agent: str | None = None,
             label: str | None = None, explanation: str | None = None,
             out: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Record a score for ``target`` (see the module docstring); returns its attributes.

    ``value`` is a number or named parts (``{"helpful": 1.0, "polite": 0.5}``, summed), finite;
    ``name`` says what was scored (default ``feedback``); the same target and name recorded
    again replaces the earlier score at conversion (the latest wins). ``kind``: where it came
    from (``human`` by default). ``explanation`` is kept at the ``messages`` capture level only.
    """
    attributes = evaluation_attributes(target, value, name=name, kind=kind, agent=agent,
                                       label=label, explanation=explanation)
    if out is None and _capture_is_on():
        _emit_span(attributes)
        return attributes
    directory = out if out is not None else os.environ.get("AGL_BRIDGE_PARQUET_DIR")
    if not directory:
        raise RuntimeError("feedback has nowhere to go: pass out=SPANS_DIR, set "
                           "AGL_BRIDGE_PARQUET_DIR, or call it where agl-bridge capture is on")
    write_rows(directory, [evaluation_row(attributes)])
    return attributes


def _capture_is_on() -> bool:
    from agl_bridge.otel.setup import capture_provider

    return capture_provider() is not None


def _emit_span(attributes: dict[str, Any]) -> None:
    """A zero-length span outside any scope (the score belongs to its target, not to whatever
    episode this code runs in), through the process's exporters."""
    from opentelemetry.context import Context

    from agl_bridge.scope import tracer

    tracer().start_span(sc.GEN_AI_EVALUATION_RESULT, context=Context(),
                        attributes=attributes).end()


def evaluation_row(attributes: dict[str, Any], *, service_name: str | None = None,
                   time_unix_nano: int | None = None) -> dict[str, Any]:
    """An evaluation record as a span row of its own (``agl_bridge.otel.rows.evaluation_row``,
    imported on call: the rows module imports pyarrow and the SDK)."""
    from agl_bridge.otel.rows import evaluation_row as row

    return row(attributes, service_name=service_name, time_unix_nano=time_unix_nano)


def write_rows(directory: str | os.PathLike[str], rows: list[dict[str, Any]]) -> None:
    """Durably append span rows to a span Parquet directory (one writer per directory per
    process, closed at exit; its write-ahead log makes each call durable on return)."""
    from agl_bridge.otel.parquet_writer import SpanParquetWriter

    key = os.path.abspath(os.fspath(directory))
    with _writers_lock:
        writer = _writers.get(key)
        if writer is None:
            import atexit

            # feedback is sparse: its logs become Parquet (visible to conversion) within
            # seconds, not the span writer's minute
            writer = _writers[key] = SpanParquetWriter(key, max_file_age_s=FEEDBACK_FILE_AGE_S)
            atexit.register(writer.close)
    writer.write_rows(rows)


def flush_feedback() -> None:
    """Make every score this process wrote directly visible to conversion now (they are
    durable already; this turns their write-ahead logs into Parquet)."""
    with _writers_lock:
        writers = list(_writers.values())
    for writer in writers:
        writer.flush()
