from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

sys.path.insert(0, str(Path(__file__).parent))

from agl_bridge.otel.processors import ScopeSpanProcessor  # noqa: E402

# One global provider for the whole session (OpenTelemetry allows setting it once).
_MEMORY = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(ScopeSpanProcessor())  # as configure_tracing and auto add it
_PROVIDER.add_span_processor(SimpleSpanProcessor(_MEMORY))
trace.set_tracer_provider(_PROVIDER)


@pytest.fixture
def spans() -> InMemorySpanExporter:
    """Finished spans of this test only (``spans.get_finished_spans()``)."""
    _MEMORY.clear()
    yield _MEMORY
    _MEMORY.clear()


@pytest.fixture
def provider() -> TracerProvider:
    return _PROVIDER


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> Path:
    """This tree built as a wheel (with the start-up hook), as users install it."""
    dist = tmp_path_factory.mktemp("dist")
    root = Path(__file__).resolve().parents[1]
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(dist), str(root)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("agl_bridge-*.whl")
    return wheel


@pytest.fixture
def instrumented():
    """The OpenAI instrumentor on for one test (framework tests override this fixture)."""
    from agl_bridge.aliases import disable_routing, routing_enabled
    from agl_bridge.integrations.openai import OpenAIInstrumentor

    routed = routing_enabled()
    inst = OpenAIInstrumentor()
    inst.instrument()
    yield inst
    inst.uninstrument()
    if not routed:  # instrument() turned alias routing on, and uninstrument() leaves it on
        disable_routing()
