"""``Instrumentor``: what the framework instrumentors share. Each wrapt wrapper is recorded as it
is put on, so ``uninstrument`` takes off exactly those (a manager or backend a release lacks
was never wrapped, and is not unwrapped either)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from typing import Any, ClassVar

from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.instrumentation.utils import unwrap
from wrapt import wrap_function_wrapper

from agl_bridge import semconv as sc
from agl_bridge._version import __version__


class Instrumentor(BaseInstrumentor):
    requires: ClassVar[tuple[str, ...]] = ()  # the framework versions it supports

    def instrumentation_dependencies(self) -> Collection[str]:
        return self.requires

    @staticmethod
    def tracer(kwargs: dict[str, Any]) -> trace.Tracer:
        """Our tracer, from the ``tracer_provider`` given to ``instrument`` (else the global)."""
        return trace.get_tracer(sc.INSTRUMENTATION_SCOPE, __version__,
                                kwargs.get("tracer_provider"))

    def wrap(self, owner: Any, path: str, wrapper: Callable[..., Any]) -> None:
        """Wrap ``path`` (``"Class.method"`` or a name) of ``owner`` (an object, or a module's
        name) until ``uninstrument``."""
        if isinstance(owner, str):
            owner = importlib.import_module(owner)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        wrap_function_wrapper(owner, name, wrapper)
        self.__dict__.setdefault("_wrapped", []).append((owner, name))

    def _uninstrument(self, **kwargs: Any) -> None:
        for owner, name in reversed(self.__dict__.pop("_wrapped", [])):
            unwrap(owner, name)
