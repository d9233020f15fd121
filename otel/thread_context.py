"""Carry context (OpenTelemetry's, and with it the episode/agent/turn scope) into threads.

``contextvars`` follow asyncio tasks but not ``threading.Thread`` or ``ThreadPoolExecutor``
workers: a tool run in a pool would lose its episode and start a new trace. ``install`` makes
each submitted function, and each started thread, run in a copy of its starter's context, which
is what ``asyncio.to_thread`` already does for its own calls. Standard library only: zero-code
capture installs it at start-up (``ThreadContextInstrumentor`` in ``threads.py`` is the
instrumentor form of the same two functions).

(opentelemetry-instrumentation-threading does this for the OpenTelemetry context; its releases
pin an older instrumentation/API set than the current SDK, so we keep these few lines instead.)
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import threading
from typing import Any

_CTX_ATTR = "_agl_bridge_context"
_originals: dict[str, Any] = {}
_lock = threading.Lock()


def installed() -> bool:
    return bool(_originals)


def install() -> None:
    """Idempotent."""
    with _lock:
        if _originals:
            return
        submit: Any = concurrent.futures.ThreadPoolExecutor.submit
        start, run = threading.Thread.start, threading.Thread.run

        @functools.wraps(submit)
        def _submit(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not args:  # fn given by keyword: let the executor raise its own error
                return submit(self, *args, **kwargs)
            return submit(self, contextvars.copy_context().run, *args, **kwargs)

        @functools.wraps(start)
        def _start(self: Any, *args: Any, **kwargs: Any) -> Any:
            setattr(self, _CTX_ATTR, contextvars.copy_context())
            return start(self, *args, **kwargs)

        @functools.wraps(run)
        def _run(self: Any, *args: Any, **kwargs: Any) -> Any:
            ctx = getattr(self, _CTX_ATTR, None)
            if ctx is None:
                return run(self, *args, **kwargs)
            return ctx.run(run, self, *args, **kwargs)

        _originals.update(submit=submit, start=start, run=run)
        concurrent.futures.ThreadPoolExecutor.submit = _submit  # type: ignore[method-assign,assignment]
        threading.Thread.start = _start  # type: ignore[method-assign]
        threading.Thread.run = _run  # type: ignore[method-assign]


def uninstall() -> None:
    """Idempotent. Threads already started keep the context they were given."""
    with _lock:
        if not _originals:
            return
        concurrent.futures.ThreadPoolExecutor.submit = _originals.pop(  # type: ignore[method-assign]
            "submit")
        threading.Thread.start = _originals.pop("start")  # type: ignore[method-assign]
        threading.Thread.run = _originals.pop("run")  # type: ignore[method-assign]
