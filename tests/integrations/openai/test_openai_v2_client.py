"""The instrumentor on the openai 2.x client (MassGen pins ``openai==2.2.0``).

A session fixture builds, once, a venv with openai 2.2.0 and this package (``--no-deps -e``)
under ``.cache/venv-openai2``; a script runs there against the scripted server (sync, async,
streamed both ways, tools) and prints its spans as JSON for the assertions here. If the venv
cannot be built the test fails with pip's output: openai 2.x support is a requirement.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agl_bridge import semconv as sc
from tests.paths import ROOT, TESTS

VENV = ROOT / ".cache" / "venv-openai2"
REQUIREMENTS = ["openai==2.2.0", "opentelemetry-sdk", "opentelemetry-instrumentation", "wrapt",
                "pyarrow"]
MARKER = VENV / "agl-bridge-venv.json"  # written last: a venv without it is rebuilt

SCRIPT = r"""
import asyncio, importlib.util, json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
trace.set_tracer_provider(provider)

import openai
import agl_bridge
from agl_bridge.integrations.openai import OpenAIInstrumentor
# the scripted server from its file (tests are not installed in this venv)
spec = importlib.util.spec_from_file_location("scripted_server", sys.argv[1])
scripted_server = importlib.util.module_from_spec(spec)
sys.modules["scripted_server"] = scripted_server  # dataclasses look their module up
spec.loader.exec_module(scripted_server)
ScriptedServer = scripted_server.ScriptedServer

OpenAIInstrumentor().instrument()
MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
seen = {}

async def run_async(url):
    client = openai.AsyncOpenAI(base_url=url, api_key="k")
    with agl_bridge.episode("async"):
        r = await client.chat.completions.create(model="m", messages=MESSAGES * 2)
    seen["async"] = [r.prompt_token_ids, r.choices[0].token_ids, r.choices[0].logprobs]
    with agl_bridge.episode("async-stream"):
        s = await client.chat.completions.create(model="m", messages=MESSAGES * 3, stream=True)
    chunks = [c async for c in s]
    seen["async-stream"] = "".join(c.choices[0].delta.content or "" for c in chunks)
    with agl_bridge.episode("async-early"):
        s = await client.chat.completions.create(model="m", messages=MESSAGES * 4, stream=True)
    async with s:
        async for c in s:
            break

with ScriptedServer(vllm=True) as server:
    client = openai.OpenAI(base_url=server.base_url, api_key="k")
    with agl_bridge.episode("sync"):
        r = client.chat.completions.create(model="m", messages=MESSAGES)
    seen["sync"] = [r.prompt_token_ids, r.choices[0].token_ids, r.choices[0].logprobs]
    with agl_bridge.episode("stream"):
        chunks = list(client.chat.completions.create(
            model="m", messages=MESSAGES * 5, stream=True, stream_options={"include_usage": True}))
    seen["stream"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    seen["stream-ids-in-chunks"] = [getattr(c.choices[0], "token_ids", None)
                                    for c in chunks if c.choices]
    with agl_bridge.episode("raw"):
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES * 6, stream=True)
    seen["raw"] = [getattr(c.choices[0], "token_ids", None) for c in raw.parse()]
    asyncio.run(run_async(server.base_url))
    requests = server.requests

with ScriptedServer(vllm=True, reply="", tool_calls=[
        {"id": "call_9", "name": "add", "arguments": '{"a": 1}'}]) as tools_server:
    client = openai.OpenAI(base_url=tools_server.base_url, api_key="k")
    with agl_bridge.episode("tools"):
        list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True,
                                            tools=TOOLS))

print(json.dumps({
    "openai": openai.__version__,
    "seen": seen,
    "requests": requests,
    "spans": [{"name": s.name, "status": s.status.status_code.name,
               "ended": s.end_time is not None,
               "attributes": {k: list(v) if isinstance(v, tuple) else v
                              for k, v in s.attributes.items()}}
              for s in memory.get_finished_spans()],
}))
"""


def _run(cmd: list[str], what: str) -> str:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    assert result.returncode == 0, f"{what} failed ({result.returncode}):\n{result.stdout}\n" \
                                   f"{result.stderr}"
    return result.stdout


@pytest.fixture(scope="session")
def openai2_python() -> Path:
    """The python of a venv with openai 2.2.0 and this package; built once, then reused."""
    python = VENV / "bin" / "python"
    wanted = {"requirements": REQUIREMENTS, "root": str(ROOT),
              "python": ".".join(map(str, sys.version_info[:2]))}
    ready = MARKER.exists() and python.exists() and json.loads(MARKER.read_text()) == wanted
    if not ready:
        shutil.rmtree(VENV, ignore_errors=True)
        base = getattr(sys, "_base_executable", None) or sys.executable
        _run([base, "-m", "venv", VENV], "python -m venv")
        pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        _run([*pip, *REQUIREMENTS], "pip install " + " ".join(REQUIREMENTS))
        _run([*pip, "--no-deps", "-e", ROOT], "pip install --no-deps -e .")
        MARKER.write_text(json.dumps(wanted))
    found = _run([python, "-c", "import openai, agl_bridge.integrations.openai as m; "
                                "print(openai.__version__); print(m.__file__)"],
                 "import in the openai 2 venv").split()
    assert found[0] == "2.2.0"
    assert Path(found[1]).resolve() == ROOT / "integrations" / "openai" / "__init__.py"  # here
    return python


@pytest.fixture(scope="module")
def run2(openai2_python):
    out = _run([openai2_python, "-c", SCRIPT, TESTS / "scripted_server.py"],
               "the openai 2 script")
    return json.loads(out.strip().splitlines()[-1])


def by_episode(run2):
    return {s["attributes"][sc.EPISODE_ID]: s for s in run2["spans"]
            if s["name"].startswith("chat")}


def test_it_runs_on_openai_2(run2):
    assert run2["openai"] == "2.2.0"
    assert set(by_episode(run2)) == {"sync", "async", "stream", "async-stream", "async-early",
                                     "tools", "raw"}
    assert all(s["ended"] for s in run2["spans"])


def test_non_streaming_calls_record_ids_and_hand_back_vllms_nulls(run2):
    spans = by_episode(run2)
    for name, messages in (("sync", 1), ("async", 2)):
        a = spans[name]["attributes"]
        assert a[sc.PROMPT_TOKEN_IDS] == [1, 2, 3, messages]
        assert a[sc.COMPLETION_TOKEN_IDS] == [11, 12, 13]
        assert a[sc.COMPLETION_LOGPROBS] == [-0.5, -0.75, -1.0]
        assert a[sc.LLM_STREAM] is False and a[sc.TOKEN_IDS_STATUS] == sc.TOKEN_IDS_RECORDED
        assert run2["seen"][name] == [None, None, None]
    assert all(r["return_token_ids"] is True for r in run2["requests"])


def test_streams_record_ids_usage_and_early_ends(run2):
    spans = by_episode(run2)
    for name, messages in (("stream", 5), ("async-stream", 3)):
        a = spans[name]["attributes"]
        assert a[sc.LLM_STREAM] is True and spans[name]["status"] == "UNSET"
        assert a[sc.PROMPT_TOKEN_IDS] == [1, 2, 3, messages]
        assert a[sc.COMPLETION_TOKEN_IDS] == [11, 12, 13]
        assert a[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
        assert run2["seen"][name] == "hello"
    assert spans["stream"]["attributes"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert sc.GEN_AI_USAGE_OUTPUT_TOKENS not in spans["async-stream"]["attributes"]
    assert run2["seen"]["stream-ids-in-chunks"] == [None] * 4
    early = spans["async-early"]["attributes"]
    assert early[sc.PROMPT_TOKEN_IDS] == [1, 2, 3, 4] and early[sc.COMPLETION_TOKEN_IDS] == []
    raw = spans["raw"]["attributes"]
    assert raw[sc.PROMPT_TOKEN_IDS] == [1, 2, 3, 6] and raw[sc.COMPLETION_TOKEN_IDS] == [11, 12, 13]
    assert run2["seen"]["raw"] == [None] * 4
    # only the call that asked for usage sends stream_options
    assert [len(r["messages"]) for r in run2["requests"] if "stream_options" in r] == [5]


def test_streamed_tool_calls(run2):
    a = by_episode(run2)["tools"]["attributes"]
    assert a[sc.LLM_TOOL_NAMES] == ["add"]
    assert a[sc.LLM_TOOL_CALL_NAMES] == ["add"] and a[sc.LLM_TOOL_CALL_IDS] == ["call_9"]
    assert a[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["tool_calls"]
