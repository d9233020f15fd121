"""A program's exit waits at most ``SHUTDOWN_BOUND_S`` for our exporters whatever the endpoint
does, and every span lost on the way is counted in one line (issue 30.8)."""

import logging
import socket
import subprocess
import sys
import textwrap
import threading
import time

from opentelemetry.sdk.trace import TracerProvider

from agl_bridge.otel.processors import SHUTDOWN_BOUND_S, BoundedBatchSpanProcessor


class FullDisk:
    """An exporter whose writes fail as on a full disk."""

    def export(self, spans):
        raise OSError(28, "No space left on device")

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True


def test_refused_batches_are_counted_in_one_line_not_tracebacks(caplog):
    provider = TracerProvider()
    processor = BoundedBatchSpanProcessor(FullDisk(), max_export_batch_size=10)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    with caplog.at_level(logging.WARNING):
        for i in range(35):
            tracer.start_span(f"s{i}").end()
        provider.shutdown()
    assert processor.lost == {"refused by the exporter": 35}
    lines = [r.getMessage() for r in caplog.records]
    assert sum("refused 10 span(s): [Errno 28] No space left on device" in m for m in lines) == 1
    assert "FullDisk: 35 span(s) not exported: 35 refused by the exporter" in lines[-1]
    assert not any(r.exc_info for r in caplog.records)  # no traceback per batch


def test_a_hanging_otlp_endpoint_holds_the_exit_for_the_bound_only(tmp_path):
    """The SDK waited 10 s per batch up to its 30 s join: 4 batches held the exit 30 s."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(100)
    held = []
    threading.Thread(target=lambda: [held.append(server.accept()) for _ in range(100)],
                     daemon=True).start()
    code = textwrap.dedent(f"""
        import os
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:{server.getsockname()[1]}"
        os.environ["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
        from agl_bridge.otel import configure_tracing
        tracer = configure_tracing(otlp=True).get_tracer("app")
        for i in range(2000):
            tracer.start_span(f"s{{i}}").end()
    """)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    assert took < SHUTDOWN_BOUND_S + 8, took  # start-up and imports, then the bound
    assert "OTLPSpanExporter: " in out.stderr and " span(s) not exported: " in out.stderr
    assert "not exported within the 10 s shutdown bound" in out.stderr
