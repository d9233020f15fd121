"""Tracer provider setup: add our exporters to the provider the process has, or bring one.

An application that configures OpenTelemetry itself keeps its provider, sampler and exporters;
we only add span processors. ``configure_tracing`` does that now (explicit use);
``configure_deferred`` (zero-code start-up) waits: the application has not run yet, and if it
sets its own provider later, ours must not be in the way. So our processors join the
application's provider when it sets one, and our own provider is installed only when agl-bridge
is about to start a span and none is set. If an application sets its provider after that (too
late: OpenTelemetry allows one global provider), its processors are added to ours, so its
exporters still receive every span. The application's processors get spans without the token
ids and logprobs only training reads (``processors.keep_training_data_out``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from agl_bridge import _lazy
from agl_bridge.otel.processors import (
    BoundedBatchSpanProcessor,
    ScopeSpanProcessor,
    keep_training_data_out,
    ours,
)

logger = logging.getLogger(__name__)

EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
SCHEDULE_DELAY_ENV = "OTEL_BSP_SCHEDULE_DELAY"
DEFAULT_EXPORTERS = "parquet"


def otlp_exporter() -> SpanExporter:
    """The OTLP exporter the standard variables ask for: ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``
    or ``OTEL_EXPORTER_OTLP_PROTOCOL`` = ``grpc`` (default, as ``opentelemetry-instrument``'s
    ``otlp``) or ``http/protobuf``; endpoint, headers and TLS from ``OTEL_EXPORTER_OTLP_*``."""
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip().lower()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )
        return GrpcExporter()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )
        return HttpExporter()
    raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: expected 'grpc' or "
                     f"'http/protobuf'")


def _parquet_exporter(directory=None) -> SpanExporter:
    from agl_bridge.otel.log_capture import capture_logs
    from agl_bridge.otel.parquet_exporter import ParquetSpanExporter  # pyarrow: when needed

    exporter = ParquetSpanExporter(directory)
    capture_logs(exporter.writer)  # evaluation events sent as log records go to the same files
    return exporter


_MAKERS: dict[str, Callable[[], SpanExporter]] = {
    "parquet": _parquet_exporter, "otlp": otlp_exporter,
    "otlp_proto_grpc": otlp_exporter, "otlp_proto_http": otlp_exporter,
    "console": ConsoleSpanExporter,
}


def exporter_names_from_env() -> list[str]:
    """``OTEL_TRACES_EXPORTER``: comma-separated ``parquet`` (default), ``otlp``, ``console``,
    ``none``; ``both`` means ``otlp,parquet``. An unknown name is an error naming it."""
    raw = os.environ.get(EXPORTER_ENV, "").strip() or DEFAULT_EXPORTERS
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    if names == ["both"]:
        names = ["otlp", "parquet"]
    unknown = [n for n in names if n not in _MAKERS and n != "none"]
    if unknown:
        raise ValueError(f"{EXPORTER_ENV}={raw!r}: unknown exporter(s) {unknown}; "
                         f"expected {sorted(_MAKERS)} or 'none'")
    return [n for n in names if n != "none"]


def _add_scope_processor(provider: TracerProvider) -> None:
    """Once per provider: the scope goes onto spans other libraries start, too."""
    if not getattr(provider, "_agl_bridge_scope_processor", False):
        provider.add_span_processor(ScopeSpanProcessor())
        setattr(provider, "_agl_bridge_scope_processor", True)  # noqa: B010 (foreign object)


def _processor(exporter: SpanExporter, batch: bool) -> SpanProcessor:
    """Simple (export on end) or batch. A batch processor waits ``OTEL_BSP_SCHEDULE_DELAY``
    (5 s by default) between exports, fine for a network exporter; but a finished span is only
    safe from a kill once an exporter with a write-ahead log has written it, so an exporter
    that declares ``MAX_EXPORT_DELAY_MS`` (ours: 200) gets that delay instead, unless the user
    set the variable. The span's end still only appends it to the processor's queue: the cost
    of the shorter delay is more, smaller exports on the worker thread (benchmarks/README.md).
    """
    if not batch:
        return ours(SimpleSpanProcessor(exporter))
    delay = getattr(exporter, "MAX_EXPORT_DELAY_MS", None)
    if delay is not None and not os.environ.get(SCHEDULE_DELAY_ENV, "").strip():
        return ours(BoundedBatchSpanProcessor(exporter, schedule_delay_millis=delay))
    return ours(BoundedBatchSpanProcessor(exporter))


def _new_provider(service_name: str | None) -> TracerProvider:
    name = service_name or os.environ.get("OTEL_SERVICE_NAME")
    # Resource.create also reads OTEL_RESOURCE_ATTRIBUTES; the service name wins if given
    return TracerProvider(resource=Resource.create({"service.name": name} if name else {}))


def configure_tracing(
    *,
    parquet_dir: str | os.PathLike[str] | None = None,
    otlp: bool = False,
    service_name: str | None = None,
    batch: bool = True,
) -> TracerProvider:
    """Make sure spans reach Parquet and/or OTLP now; return the SDK provider that carries them.

    ``otlp=True`` follows the standard ``OTEL_EXPORTER_OTLP_*`` variables. ``batch=False``
    exports each span as it ends (short scripts, tests).
    """
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        provider = current
    else:
        provider = _new_provider(service_name)
        trace.set_tracer_provider(provider)
    _add_scope_processor(provider)
    if parquet_dir is not None:
        provider.add_span_processor(_processor(_parquet_exporter(Path(parquet_dir)), batch))
    if otlp:
        provider.add_span_processor(_processor(otlp_exporter(), batch))
    keep_training_data_out(provider)
    return provider


class DeferredTracing:
    """The zero-code setup: processors waiting for a provider (see the module docstring)."""

    def __init__(self, processors: list[SpanProcessor] | Callable[[], list[SpanProcessor]],
                 service_name: str | None = None) -> None:
        # a callable builds the processors (and their exporters) only when they are joined
        self._make = processors if callable(processors) else (lambda: processors)
        self.processors: list[SpanProcessor] = []
        self.service_name = service_name
        self.provider: TracerProvider | None = None  # where our processors ended up
        self.owned = False  # True when we installed our own provider
        self._lock = threading.Lock()
        self._original_set = trace.set_tracer_provider

    def start(self) -> DeferredTracing:
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            self._join(current)
            return self
        trace.set_tracer_provider = self._on_set  # type: ignore[assignment]
        _lazy.set_pending(self.install)
        return self

    def _join(self, provider: TracerProvider) -> None:
        _add_scope_processor(provider)
        self.processors = self._make()
        for p in self.processors:
            provider.add_span_processor(p)
        keep_training_data_out(provider)
        self.provider = provider

    def _on_set(self, provider) -> None:
        with self._lock:
            if self.provider is None:  # the application came first: use its provider
                self._original_set(provider)
                if isinstance(provider, TracerProvider):
                    self._join(provider)
                    _lazy.set_pending(None)
                return
        # ours is installed already: OpenTelemetry will refuse theirs; keep their exporters
        self._original_set(provider)
        if self.owned and isinstance(provider, TracerProvider) and provider is not self.provider:
            self.provider.add_span_processor(provider._active_span_processor)
            logger.warning("agl_bridge: the application set a tracer provider after agl-bridge "
                           "installed its own; its span processors now receive our provider's "
                           "spans (its sampler and resource are not used)")

    def install(self) -> None:
        """Install our provider unless one is set (called before our first span)."""
        with self._lock:
            if self.provider is not None:
                return
            current = trace.get_tracer_provider()
            if isinstance(current, TracerProvider):
                self._join(current)
                return
            provider = _new_provider(self.service_name)
            self._join(provider)
            self.owned = True
            self._original_set(provider)

    def stop(self) -> None:
        """Undo the patch (tests); processors already joined stay."""
        trace.set_tracer_provider = self._original_set
        _lazy.set_pending(None)


class _EnsuringTracer(trace.Tracer):
    """Runs the pending install before its first span, then is the global provider's tracer."""

    def __init__(self, *args) -> None:
        self._args = args
        self._real: trace.Tracer | None = None

    def _tracer(self) -> trace.Tracer:
        if self._real is not None:
            return self._real
        _lazy.ensure()
        tracer = trace.get_tracer(*self._args)
        if isinstance(trace.get_tracer_provider(), TracerProvider):
            self._real = tracer
        return tracer

    def start_span(self, *args, **kwargs):
        return self._tracer().start_span(*args, **kwargs)

    def start_as_current_span(self, *args, **kwargs):
        return self._tracer().start_as_current_span(*args, **kwargs)


class EnsuringTracerProvider(trace.TracerProvider):
    """Give this to instrumentors (``instrument(tracer_provider=...)``) so the first span any of
    them starts installs the deferred set-up, without each calling a hook."""

    def get_tracer(self, instrumenting_module_name, instrumenting_library_version=None,
                   schema_url=None, attributes=None):
        return _EnsuringTracer(instrumenting_module_name, instrumenting_library_version,
                               schema_url, attributes)


def configure_deferred(service_name: str | None = None) -> DeferredTracing:
    """Zero-code start-up: exporters from the environment (names checked now, exporters built
    when a provider is joined or installed), attached when a provider exists."""
    names = exporter_names_from_env()
    return DeferredTracing(lambda: [_processor(_MAKERS[n](), batch=True) for n in names],
                           service_name).start()


def warn(message: str) -> None:
    """Start-up problems must reach the user but never stop their program."""
    print(f"agl-bridge: {message}", file=sys.stderr)


def capture_provider() -> TracerProvider | None:
    """The SDK provider agl-bridge's processors are on, or None where capture is off (zero-code
    capture installs its provider here if it was waiting for the first span)."""
    _lazy.ensure()
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider) and getattr(provider, "_agl_bridge_scope_processor",
                                                        False):
        return provider
    return None
