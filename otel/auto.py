"""Zero-code activation: ``AGL_BRIDGE_AUTO=1 python app.py``, with no import or code change.

The wheel ships ``agl_bridge_auto.pth``; Python runs its one line at start-up, and that line
imports this module only when ``AGL_BRIDGE_AUTO`` is 1/true/yes/on; unset, the hook costs only
Python compiling the line (measured: benchmarks/startup_hook.py). ``activate`` then

* sets up export from the environment (``OTEL_TRACES_EXPORTER``: ``parquet`` by default,
  ``otlp``, or both; ``AGL_BRIDGE_PARQUET_DIR``; ``OTEL_SERVICE_NAME``; the standard
  ``OTEL_EXPORTER_OTLP_*``), reusing a provider the application sets (``DeferredTracing``);
* turns on every agl-bridge instrumentor (``INSTRUMENTORS``: the wheel's entry points
  ``opentelemetry_instrumentor`` named ``agl_bridge_*``, which a test keeps equal to it), each
  when its framework is first imported, so a program that never imports openai never pays for
  importing it. Neither the entry points nor the instrumentor classes are loaded at start-up:
  scanning installed packages' metadata, the OpenTelemetry instrumentation base class and wrapt
  (which imports asyncio) cost every process tens of milliseconds before its first line
  (benchmarks/startup_hook.py); context into threads is installed at start-up directly;
* never stops the program: a bad setting is reported on stderr and capture stays off.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from types import ModuleType
from typing import Any

from agl_bridge.capture import capture_level
from agl_bridge.otel import thread_context
from agl_bridge.otel.import_hooks import when_imported
from agl_bridge.otel.setup import (
    DeferredTracing,
    EnsuringTracerProvider,
    configure_deferred,
    warn,
)

AUTO_ENV = "AGL_BRIDGE_AUTO"
ENTRY_POINT_GROUP = "opentelemetry_instrumentor"
ENTRY_POINT_PREFIX = "agl_bridge_"
#: entry-point name -> (the instrumentor, the top-level module whose import turns it on;
#: None: turned on at start-up by ``thread_context.install`` rather than through its class)
INSTRUMENTORS: dict[str, tuple[str, str | None]] = {
    "agl_bridge_openai": ("agl_bridge.integrations.openai:OpenAIInstrumentor", "openai"),
    "agl_bridge_routing": ("agl_bridge.integrations.openai:RoutingInstrumentor", "openai"),
    "agl_bridge_langchain": ("agl_bridge.integrations.langchain:LangChainInstrumentor",
                             "langchain_core"),
    "agl_bridge_autogen": ("agl_bridge.integrations.autogen:AutoGenInstrumentor",
                           "autogen_agentchat"),
    "agl_bridge_massgen": ("agl_bridge.integrations.massgen:MassGenInstrumentor", "massgen"),
    "agl_bridge_threads": ("agl_bridge.otel.threads:ThreadContextInstrumentor", None),
}
_TRUE = ("1", "true", "yes", "on")
#: Arrow's default allocator (mimalloc) reads its options from the environment once, when
#: pyarrow loads, and by default commits arena memory eagerly; with eager commit off the
#: exporter's peak RSS is lower (figures: benchmarks/README.md, export memory). Set only
#: when unset, at start-up, while the interpreter is still single-threaded (changing the
#: environment while other threads may read it is not safe in C), and before pyarrow loads.
ARROW_ALLOCATOR_ENV = {"MIMALLOC_ARENA_EAGER_COMMIT": "0"}

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
        if "pyarrow" not in sys.modules:
            for key, value in ARROW_ALLOCATOR_ENV.items():
                os.environ.setdefault(key, value)
        capture_level()  # a bad AGL_BRIDGE_CAPTURE is reported now, not at the first call
        _state = configure_deferred()
        for name, (target, module) in INSTRUMENTORS.items():
            if module is None:
                thread_context.install()
                instrumented.append(name)
            else:
                when_imported(module, functools.partial(_instrument, name, target))
    except Exception as exc:
        warn(f"{AUTO_ENV} is set but start-up failed ({type(exc).__name__}: {exc}); "
             f"the program runs without agl-bridge capture")
        return None
    return _state


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _instrument(name: str, target: str, _module: ModuleType | None = None) -> None:
    """Turn on the instrumentor ``target`` (run when its framework is imported)."""
    try:
        cls = _load(target)
    except Exception as exc:
        warn(f"cannot load instrumentor {name} ({target}): {exc}")
        return
    try:
        cls().instrument(tracer_provider=EnsuringTracerProvider())
        instrumented.append(name)
    except Exception as exc:
        warn(f"instrumentor {name} failed ({type(exc).__name__}: {exc}); left uninstrumented")
