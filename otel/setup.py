"""Tracer provider setup: add our exporters to the provider the process already has, or make one.

An application that configured OpenTelemetry itself keeps its provider, sampler and exporters;
we only add processors. Replacing a global provider is impossible in OpenTelemetry anyway (the
second ``set_tracer_provider`` is ignored with a warning), and silently losing spans is worse.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

from agl_bridge.otel.parquet_exporter import ParquetSpanExporter

logger = logging.getLogger(__name__)


def configure_tracing(
    *,
    parquet_dir: str | os.PathLike[str] | None = None,
    otlp: bool = False,
    service_name: str | None = None,
    batch: bool = True,
) -> TracerProvider:
    """Make sure spans reach Parquet and/or OTLP, and return the SDK provider that carries them.

    ``otlp=True`` uses the standard ``OTEL_EXPORTER_OTLP_*`` variables (endpoint, headers,
    protocol defaults of the OTLP/gRPC exporter). ``batch=False`` exports each span as it ends,
    for short scripts and tests that must see every span without a flush.
    """
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        provider = current
    else:
        name = service_name or os.environ.get("OTEL_SERVICE_NAME") or "agl-bridge"
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        trace.set_tracer_provider(provider)

    def add(exporter) -> None:
        processor: SpanProcessor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        provider.add_span_processor(processor)

    if parquet_dir is not None:
        add(ParquetSpanExporter(Path(parquet_dir)))
    if otlp:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        add(OTLPSpanExporter())
    return provider
