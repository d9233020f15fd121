"""``ThreadContextInstrumentor``: the instrumentor form of ``thread_context`` (context carried
into threads and thread pools), for ``opentelemetry-instrument`` and explicit set-ups."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from agl_bridge.otel import thread_context


class ThreadContextInstrumentor(BaseInstrumentor):
    """``ThreadContextInstrumentor().instrument()``; undone by ``uninstrument()``."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        thread_context.install()

    def _uninstrument(self, **kwargs: Any) -> None:
        thread_context.uninstall()
