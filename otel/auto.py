"""Zero-code activation: ``AGL_BRIDGE_AUTO=1 python app.py``, with no import or code change.

The wheel ships ``agl_bridge_auto.pth``; Python runs its one line at start-up, and that line
imports this module only when ``AGL_BRIDGE_AUTO`` is 1/true/yes/on; unset, the hook costs only
Python compiling the line (measured: benchmarks/startup_hook.py). ``activate`` then

* sets up export from the environment (``OTEL_TRACES_EXPORTER``: ``parquet`` by default,
  ``otlp``, or both; ``AGL_BRIDGE_PARQUET_DIR``; ``OTEL_SERVICE_NAME``; the standard
  ``OTEL_EXPORTER_OTLP_*``), reusing a provider the application sets (``DeferredTracing``);
* turns on every agl-bridge instrumentor (entry points ``opentelemetry_instrumentor`` named
  ``agl_bridge_*``), each when its framework is first imported, so a program that never
  imports openai never pays for importing it;
* never stops the program: a bad setting is reported on stderr and capture stays off.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from typing import Any

from agl_bridge.capture import capture_level
from agl_bridge.otel.setup import (
    DeferredTracing,
    EnsuringTracerProvider,
    configure_deferred,
    warn,
)

AUTO_ENV = "AGL_BRIDGE_AUTO"
ENTRY_POINT_GROUP = "opentelemetry_instrumentor"
ENTRY_POINT_PREFIX = "agl_bridge_"
_TRUE = ("1", "true", "yes", "on")

_state: DeferredTracing | None = None
instrumented: list[str] = []  # entry-point names instrumented so far (for tests and debugging)


def enabled() -> bool:
    return os.environ.get(AUTO_ENV, "").strip().lower() in _TRUE


def activate() -> DeferredTracing | None:
    """Idempotent. Returns the tracing set-up, or None if start-up failed (reported)."""
    global _state
    if _state is not None:
        return _state
    try:
        capture_level()  # a bad AGL_BRIDGE_CAPTURE is reported now, not at the first call
        _state = configure_deferred()
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ep.name.startswith(ENTRY_POINT_PREFIX):
                _schedule(ep)
    except Exception as exc:
        warn(f"{AUTO_ENV} is set but start-up failed ({type(exc).__name__}: {exc}); "
             f"the program runs without agl-bridge capture")
        return None
    return _state


def _schedule(ep: Any) -> None:
    try:
        cls = ep.load()
    except Exception as exc:
        warn(f"cannot load instrumentor {ep.name} ({ep.value}): {exc}")
        return
    module = getattr(cls, "hook_module", None)
    if module is None:
        _instrument(ep.name, cls)
        return
    import wrapt

    wrapt.register_post_import_hook(lambda _mod: _instrument(ep.name, cls), module)


def _instrument(name: str, cls: Any) -> None:
    try:
        cls().instrument(tracer_provider=EnsuringTracerProvider())
        instrumented.append(name)
    except Exception as exc:
        warn(f"instrumentor {name} failed ({type(exc).__name__}: {exc}); left uninstrumented")
