"""Recording an exception on a span by the capture level (``agl_bridge.capture``).

An exception's message is content. A server error body that echoes the request (a 400 that
quotes the prompt, a proxy's error page) puts the user's prompt into ``str(exc)``; a tool's
exception carries whatever its arguments held. OpenTelemetry records that text at every level:
``Span.record_exception`` puts ``str(exc)`` and the full stack trace (whose last line is the
message again, as are the lines of chained causes) into an ``exception`` event, and
``start_as_current_span``/``use_span`` do so by default (``record_exception=True``) and also set
the status to ``"{type}: {exc}"`` (``set_status_on_exception=True``).

So every place agl-bridge records an exception calls ``record_error``, and every span it starts
as a context manager turns those two defaults off. What is kept:

* at every level: ``error.type`` (the exception class), status ``ERROR``;
* below ``messages``: as status description and ``exception.message`` only the class name and,
  for HTTP errors, the status code (``InternalServerError (HTTP 500)``); as
  ``exception.stacktrace`` only where it happened (file, line, function of each frame): no
  message, no source text, no chained causes, no locals;
* at ``messages``: the full text, as OpenTelemetry records it.
"""

from __future__ import annotations

import traceback

from opentelemetry.semconv.attributes.exception_attributes import (
    EXCEPTION_ESCAPED,
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
)
from opentelemetry.trace import Span, Status, StatusCode

from agl_bridge import semconv as sc
from agl_bridge.capture import CaptureLevel, capture_level


def record_error(span: Span, exc: BaseException, *, level: CaptureLevel | None = None,
                 escaped: bool = True) -> None:
    """Mark ``span`` failed by ``exc``, keeping of its text what ``level`` allows (default: the
    level in force now). Never raises: it runs while the caller's own exception propagates."""
    try:
        if not span.is_recording():
            return
        if level is None:
            try:
                level = capture_level()
            except ValueError:  # a bad AGL_BRIDGE_CAPTURE must not replace the caller's error
                level = CaptureLevel.NONE
        span.set_attribute(sc.ERROR_TYPE, type(exc).__qualname__)
        if level >= CaptureLevel.MESSAGES:
            span.record_exception(exc, escaped=escaped)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            return
        summary = error_summary(exc)
        span.add_event("exception", {
            EXCEPTION_TYPE: _qualified_type(exc),
            EXCEPTION_MESSAGE: summary,
            EXCEPTION_STACKTRACE: frame_locations(exc),
            EXCEPTION_ESCAPED: str(escaped),
        })
        span.set_status(Status(StatusCode.ERROR, summary))
    except Exception:  # pragma: no cover - recording must never mask the caller's exception
        pass


def error_summary(exc: BaseException) -> str:
    """The class name, and the HTTP status if it is an HTTP error: nothing a payload can carry."""
    name = type(exc).__name__
    status = http_status(exc)
    return f"{name} (HTTP {status})" if status is not None else name


def http_status(exc: BaseException) -> int | None:
    """The status code of an openai ``APIStatusError`` or an httpx ``HTTPStatusError``."""
    for holder in (exc, getattr(exc, "response", None)):
        status = getattr(holder, "status_code", None)
        if isinstance(status, int) and not isinstance(status, bool):
            return status
    return None


def frame_locations(exc: BaseException) -> str:
    """Where ``exc`` was raised, innermost last: file, line and function of each frame.

    No source lines: a line of code can hold a literal (a key, a prompt template), and the
    locations alone say where to look.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    lines = [f'  File "{f.filename}", line {f.lineno}, in {f.name}' for f in frames]
    return "\n".join(["Traceback (most recent call last):", *lines, _qualified_type(exc)])


def _qualified_type(exc: BaseException) -> str:
    module = type(exc).__module__
    qualname = type(exc).__qualname__
    return f"{module}.{qualname}" if module and module != "builtins" else qualname
