from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agl_bridge.otel.processors import ScopeSpanProcessor
from tests.massgen_venv import build_massgen_python
from tests.paths import EXAMPLES, ROOT

# One global provider for the whole session (OpenTelemetry allows setting it once).
_MEMORY = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(ScopeSpanProcessor())  # as configure_tracing and auto add it
_PROVIDER._agl_bridge_scope_processor = True  # type: ignore[attr-defined]  # as they mark it
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
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--no-build-isolation", "-w", str(dist), str(ROOT)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("agl_bridge-*.whl")
    return wheel


@pytest.fixture(scope="module")
def massgen_python(built_wheel) -> Path:
    """The python of a venv holding the real MassGen 0.1.97 and this tree's wheel."""
    return build_massgen_python(built_wheel)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    """A tiny random Llama model with its tokenizer (nothing downloaded), for the session."""
    from agl_bridge.trainer.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def start(tmp_path):
    """Start OTLP receivers writing span Parquet to ``tmp_path/out``; all stop afterwards."""
    from agl_bridge.otel import SpanParquetWriter
    from agl_bridge.otel.receiver import OTLPReceiver

    started = []

    def start(**options):
        rx = OTLPReceiver(SpanParquetWriter(tmp_path / "out"), http_port=0, grpc_port=0,
                          **options).start()
        started.append(rx)
        return rx
    yield start
    for rx in started:
        rx.stop()


@pytest.fixture
def instrumented():
    """The OpenAI instrumentor on for one test (framework tests override this fixture)."""
    from agl_bridge.integrations.openai import OpenAIInstrumentor, disable_routing, routing_enabled

    routed = routing_enabled()
    inst = OpenAIInstrumentor()
    inst.instrument()
    yield inst
    inst.uninstrument()
    if not routed:  # instrument() turned alias routing on, and uninstrument() leaves it on
        disable_routing()


def load_example(name: str) -> ModuleType:
    """An example program (``examples/<name>.py``) as a module, as a user would run it: the
    examples are programs, not a package, so they are loaded from their file."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
