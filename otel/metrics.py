"""Prometheus metrics of what the long-running commands take in and lose: ``collect``'s
receiver (requests, spans and log records received, written, quarantined, ignored) and the
spans our exporters' batch processors lost in this process (queue full, refused by the
exporter, e.g. on a full disk).

The counts already live where they are counted (``ReceiverStats``,
``BoundedBatchSpanProcessor.lost``); the collectors here read them when Prometheus scrapes, so
the request path does nothing more than it did. ``prometheus-client`` is the ``metrics`` extra,
imported only when a metrics port is asked for (``require``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agl_bridge.otel.processors import BoundedBatchSpanProcessor

if TYPE_CHECKING:
    from agl_bridge.otel.parquet_writer import SpanParquetWriter
    from agl_bridge.otel.receiver import OTLPReceiver

PREFIX = "agl_bridge"
EXTRA = "pip install 'agl-bridge[metrics]'"


def require() -> Any:
    """The ``prometheus_client`` module, or an error that says how to get it."""
    try:
        import prometheus_client
    except ImportError:
        raise RuntimeError(f"metrics need prometheus-client: {EXTRA}") from None
    return prometheus_client


class ReceiverCollector:
    """``collect``'s counters, read from its receiver and writer at each scrape."""

    def __init__(self, receiver: OTLPReceiver, writer: SpanParquetWriter) -> None:
        self.receiver, self.writer = receiver, writer

    def describe(self) -> list[Any]:
        return []  # metric names are fixed; nothing to check at registration

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        s = self.receiver.stats

        def counter(name: str, doc: str, value: int) -> Any:
            return CounterMetricFamily(f"{PREFIX}_collect_{name}", doc, value=value)

        requests = CounterMetricFamily(
            f"{PREFIX}_collect_requests", "OTLP export requests, by outcome: accepted, or "
            "refused whole (nothing in them written)", labels=["outcome"])
        for outcome, n in (("accepted", s.requests), ("malformed", s.requests_malformed),
                           ("unauthorized", s.requests_unauthorized),
                           ("too_large", s.requests_too_large),
                           ("failed", s.requests_failed)):
            requests.add_metric([outcome], n)
        yield requests
        yield counter("spans_received", "spans in accepted requests",
                      s.spans_written + s.spans_rejected)
        yield counter("spans_written", "spans handed to the Parquet writer", s.spans_written)
        yield counter("spans_quarantined", "spans rejected (no row can hold them) and kept "
                      "under _quarantine/ as OTLP/JSON", s.spans_rejected)
        yield counter("log_records_received", "log records in accepted requests",
                      s.log_records_written + s.log_records_rejected + s.log_records_ignored)
        yield counter("log_records_written", "evaluation events written as rows",
                      s.log_records_written)
        yield counter("log_records_quarantined", "evaluation events rejected and kept under "
                      "_quarantine/", s.log_records_rejected)
        yield counter("log_records_dropped", "log records that are not events agl-bridge "
                      "keeps (counted, not written)", s.log_records_ignored)
        yield counter("parquet_files_written", "span Parquet files the writer finished",
                      self.writer.files_written)


class ExportLossCollector:
    """Spans our batch processors in this process lost, by exporter and reason (the queue
    full, refused by the exporter: a full disk, an endpoint down; left at shutdown)."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        lost = CounterMetricFamily(
            f"{PREFIX}_export_spans_lost", "spans an agl-bridge batch span processor of this "
            "process did not export, by exporter and reason", labels=["exporter", "reason"])
        totals: dict[tuple[str, str], int] = {}
        for processor in BoundedBatchSpanProcessor.live():
            for reason, n in list(processor.lost.items()):
                key = (processor.exporter_name, reason)
                totals[key] = totals.get(key, 0) + n
        for (exporter, reason), n in sorted(totals.items()):
            lost.add_metric([exporter, reason], n)
        yield lost


def serve(registry: Any, host: str, port: int) -> Any:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread; the returned
    server's ``shutdown()`` stops it. A port in use is an error naming it."""
    prometheus_client = require()
    try:
        server, _thread = prometheus_client.start_http_server(port, addr=host,
                                                              registry=registry)
    except OSError as exc:
        raise RuntimeError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    return server


def collect_registry(receiver: OTLPReceiver, writer: SpanParquetWriter) -> Any:
    """A registry holding ``collect``'s metrics and this process's export losses."""
    registry = require().CollectorRegistry()
    registry.register(ReceiverCollector(receiver, writer))
    registry.register(ExportLossCollector())
    return registry
