"""Zero-code capture as a new user meets it: the built wheel, installed (not editable) into a
fresh venv, an unmodified agent script, configuration by environment variables only."""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agl_bridge import semconv as sc
from agl_bridge.parquet_io import iter_parquet_files
from tests.paths import AGENTS, ROOT
from tests.scripted_server import ScriptedServer

AGENT = AGENTS / "plain_openai_agent.py"
# the venv holds third-party dependencies only, cached per pyproject; our wheel is reinstalled
# on every run, so the code under test is always the current tree
VENV_DEPS = ["openai", "opentelemetry-distro"]


@pytest.fixture(scope="session")
def wheel_python(built_wheel) -> Path:
    wheel = built_wheel
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:12]
    venv = ROOT / ".cache" / f"venv-wheel-{key}"
    python = venv / "bin" / "python"
    if not (venv / ".deps-ok").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        deps = subprocess.run([str(python), "-m", "pip", "install", "-q", f"{wheel}[openai]",
                               *VENV_DEPS], capture_output=True, text=True)
        assert deps.returncode == 0, deps.stdout + deps.stderr
        (venv / ".deps-ok").touch()
    again = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                            "--force-reinstall", str(wheel)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    return python


def run_agent(python, base_url, env, *args, agent=AGENT):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
    # run from the program's own directory, as its user would (the repo root holds a source
    # folder named agl_bridge that would shadow the installed package)
    return subprocess.run([str(python), str(agent), base_url, *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=120, cwd=agent.parent)


def read_spans(directory):
    files = list(iter_parquet_files(directory))
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pylist() if files else [], files


def test_auto_captures_an_unmodified_program(wheel_python, tmp_path):
    with ScriptedServer(vllm=True, completion_ids=[5, 6]) as server:
        out = run_agent(wheel_python, server.base_url, {
            "AGL_BRIDGE_AUTO": "1", "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "traces"),
            "OTEL_SERVICE_NAME": "my-agents"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["hello"] * 3  # the program's own output is unchanged
    rows, files = read_spans(tmp_path / "traces")
    chats = {r["request_model"]: r for r in rows if r["operation_name"] == "chat"}
    assert set(chats) == {"solver", "checker", "tool-agent"}
    for r in chats.values():
        assert r["completion_token_ids"] == [5, 6] and r["prompt_token_ids"] == [1, 2, 3, 1]
        assert r["service_name"] == "my-agents"
    assert all(f.relative_to(tmp_path / "traces").parts[1] == "service=my-agents" for f in files)
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert all(b["return_token_ids"] is True for b in server.requests)


def test_auto_routes_aliases_even_where_tracing_is_suppressed(wheel_python, tmp_path):
    """Routing is not tracing: the call the program keeps out of its traces still goes to the
    live version of its alias (issue 14, item 10)."""
    aliases = tmp_path / "aliases.json"
    aliases.write_text('{"aliases": {"coder": "coder@v2"}}')
    with ScriptedServer(vllm=True) as server:
        out = run_agent(wheel_python, server.base_url, {
            "AGL_BRIDGE_AUTO": "1", "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "traces"),
            "AGL_BRIDGE_ALIASES": str(aliases)}, agent=AGENT.with_name("aliased_agent.py"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["coder@v2", "coder@v2"]
    assert [b["model"] for b in server.requests] == ["coder@v2", "coder@v2"]
    rows, _ = read_spans(tmp_path / "traces")
    (chat,) = [r for r in rows if r["operation_name"] == "chat"]  # the suppressed one: no span
    assert chat["request_model"] == "coder@v2" and chat["policy_version"] == "coder@v2"
    assert json.loads(chat["attributes"])[sc.POLICY_ALIAS] == "coder"  # the alias asked for


def test_unset_means_nothing_happens(wheel_python, tmp_path):
    with ScriptedServer(vllm=True) as server:
        out = run_agent(wheel_python, server.base_url, {
            "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "traces")})
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "traces").exists()
    assert all("return_token_ids" not in b for b in server.requests)


def test_the_applications_own_provider_is_reused(wheel_python, tmp_path):
    console = tmp_path / "console.jsonl"
    with ScriptedServer(vllm=True) as server:
        out = run_agent(wheel_python, server.base_url, {
            "AGL_BRIDGE_AUTO": "1", "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "traces")},
            "--own-provider", str(console))
    assert out.returncode == 0, out.stderr
    rows, _ = read_spans(tmp_path / "traces")
    assert sorted(r["request_model"] for r in rows) == ["checker", "solver", "tool-agent"]
    app_seen = console.read_text()
    for model in ("solver", "checker", "tool-agent"):  # the app's exporter got them too
        assert f'"name": "chat {model}"' in app_seen
    # issue 29.8: token ids and logprobs reach the training store, not the app's exporter
    assert all(r["completion_token_ids"] for r in rows)
    assert sc.COMPLETION_TOKEN_IDS not in app_seen and sc.PROMPT_TOKEN_IDS not in app_seen
    with ScriptedServer(vllm=True) as server:  # unless the user opts in
        out = run_agent(wheel_python, server.base_url, {
            "AGL_BRIDGE_AUTO": "1", "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "traces2"),
            "AGL_BRIDGE_EXPORT_TOKEN_IDS": "1"}, "--own-provider", str(console))
    assert out.returncode == 0, out.stderr
    assert sc.COMPLETION_TOKEN_IDS in console.read_text()


def test_opentelemetry_instrument_loads_our_entry_points(wheel_python, tmp_path):
    instrument = wheel_python.with_name("opentelemetry-instrument")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
    with ScriptedServer(vllm=True) as server:
        out = subprocess.run(
            [str(instrument), str(wheel_python), str(AGENT), server.base_url],
            env={**clean, "OTEL_TRACES_EXPORTER": "parquet", "OTEL_SERVICE_NAME": "via-otel",
                 "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "traces")},
            capture_output=True, text=True, timeout=120, cwd=AGENT.parent)
    assert out.returncode == 0 and (tmp_path / "traces").is_dir(), out.stderr
    rows, _ = read_spans(tmp_path / "traces")
    chats = [r for r in rows if r["operation_name"] == "chat"]
    assert len(chats) == 3 and all(r["prompt_token_ids"] for r in chats)
    assert {r["service_name"] for r in chats} == {"via-otel"}


def test_bad_settings_are_reported_and_the_program_still_runs(wheel_python, tmp_path):
    with ScriptedServer(vllm=True) as server:
        out = run_agent(wheel_python, server.base_url, {
            "AGL_BRIDGE_AUTO": "1", "OTEL_TRACES_EXPORTER": "parquet,kafka",
            "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "traces")})
    assert out.returncode == 0 and out.stdout.split() == ["hello"] * 3
    assert "agl-bridge: AGL_BRIDGE_AUTO is set but start-up failed" in out.stderr
    assert "unknown exporter(s) ['kafka']" in out.stderr
    assert not list(iter_parquet_files(tmp_path)) if (tmp_path / "traces").exists() else True


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_export_to_our_receiver_by_environment_only(wheel_python, tmp_path, protocol):
    from agl_bridge.otel import SpanParquetWriter
    from agl_bridge.otel.receiver import OTLPReceiver

    writer = SpanParquetWriter(tmp_path / "received", background_rotation=False)
    receiver = OTLPReceiver(writer, http_port=0, grpc_port=0).start()
    try:
        port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
        with ScriptedServer(vllm=True, completion_ids=[3, 4]) as server:
            out = run_agent(wheel_python, server.base_url, {
                "AGL_BRIDGE_AUTO": "1", "OTEL_TRACES_EXPORTER": "both",
                "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                "OTEL_EXPORTER_OTLP_INSECURE": "true",
                "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "local"),
                "OTEL_SERVICE_NAME": "over-otlp"})
        assert out.returncode == 0, out.stderr
    finally:
        receiver.stop()
    received, _ = read_spans(tmp_path / "received")
    local, _ = read_spans(tmp_path / "local")
    chats = sorted(r["request_model"] for r in received if r["operation_name"] == "chat")
    assert chats == ["checker", "solver", "tool-agent"]
    assert all(r["completion_token_ids"] == [3, 4] for r in received
               if r["operation_name"] == "chat")

    def key(rows):
        return sorted((r["span_id"], r["name"], r["attributes"]) for r in rows)
    assert key(received) == key(local)  # both exporters wrote the same spans


def test_the_quickstart_example_runs_captured_and_converts(wheel_python, tmp_path):
    """examples/quickstart.py as its docstring says to run it: captured under AGL_BRIDGE_AUTO=1,
    its spans convert to one transition per episode with the program's own rewards."""
    from agl_bridge.trainer.conversion import convert

    answers = iter(["5", "no idea", "13", "it is 13"])
    with ScriptedServer(vllm=True, completion_ids=[7, 8],
                        script=lambda body: (next(answers), [])) as server:
        clean = {k: v for k, v in os.environ.items()
                 if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
        out = subprocess.run(
            [str(wheel_python), str(ROOT / "examples" / "quickstart.py"), "--base-url",
             server.base_url], capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={**clean, "AGL_BRIDGE_AUTO": "1",
                 "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "traces")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["q1: '5'", "q1: 'no idea'", "q2: '13'", "q2: 'it is 13'"]
    stats = convert(tmp_path / "traces", tmp_path / "t.parquet")
    got = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert stats.transitions == 4 and stats.groups == 2 and stats.zero_variance_groups == 1
    assert sorted((t["task_id"], t["reward"]) for t in got) == [
        ("q1", 0.0), ("q1", 1.0), ("q2", 1.0), ("q2", 1.0)]
    assert all(t["completion_ids"] == [7, 8] and t["agent_name"] == "solver" for t in got)
