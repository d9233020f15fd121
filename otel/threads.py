"""Carry context (OpenTelemetry's, and with it the episode/agent/turn scope) into threads.

``contextvars`` follow asyncio tasks but not ``threading.Thread`` or ``ThreadPoolExecutor``
workers: a tool run in a pool would lose its episode and start a new trace. This instrumentor
runs each submitted function, and each started thread, in a copy of its starter's context,
which is what ``asyncio.to_thread`` already does for its own calls.

(opentelemetry-instrumentation-threading does this for the OpenTelemetry context; its releases
pin an older instrumentation/API set than the current SDK, so we keep these few lines instead.)
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.instrumentation.utils import unwrap
from wrapt import wrap_function_wrapper

_CTX_ATTR = "_agl_bridge_context"


def _submit(wrapped, instance, args, kwargs):
    if not args:  # fn given by keyword: let the executor raise its own error
        return wrapped(*args, **kwargs)
    ctx = contextvars.copy_context()
    return wrapped(ctx.run, *args, **kwargs)


def _thread_start(wrapped, instance, args, kwargs):
    setattr(instance, _CTX_ATTR, contextvars.copy_context())
    return wrapped(*args, **kwargs)


def _thread_run(wrapped, instance, args, kwargs):
    ctx = getattr(instance, _CTX_ATTR, None)
    if ctx is None:
        return wrapped(*args, **kwargs)
    return ctx.run(wrapped, *args, **kwargs)


class ThreadContextInstrumentor(BaseInstrumentor):
    """``ThreadContextInstrumentor().instrument()``; undone by ``uninstrument()``."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        wrap_function_wrapper(concurrent.futures.ThreadPoolExecutor, "submit", _submit)
        wrap_function_wrapper(threading.Thread, "start", _thread_start)
        wrap_function_wrapper(threading.Thread, "run", _thread_run)

    def _uninstrument(self, **kwargs: Any) -> None:
        unwrap(concurrent.futures.ThreadPoolExecutor, "submit")
        unwrap(threading.Thread, "start")
        unwrap(threading.Thread, "run")
