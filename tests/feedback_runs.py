"""Runs of ``tests/agents/feedback_app.py`` under zero-code capture, and the rewards conversion
gives its responses: the feedback and evaluation-event tests share them."""

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq

from agl_bridge.trainer.conversion import ConvertConfig, convert
from tests.paths import AGENTS
from tests.scripted_server import ScriptedServer

APP = AGENTS / "feedback_app.py"


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
    return {**env, **extra}


def run_app(tmp_path, n=4):
    """The app under zero-code capture, in its own process, gone before any feedback."""
    with ScriptedServer(vllm=True, unique_ids=True, completion_ids=[5, 6]) as server:
        out = subprocess.run([sys.executable, str(APP), server.base_url, str(n)],
                             env=clean_env(AGL_BRIDGE_AUTO="1",
                                           AGL_BRIDGE_PARQUET_DIR=str(tmp_path / "traces")),
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return [json.loads(line)["response_id"] for line in out.stdout.splitlines()]


def rewards_by_response(tmp_path, **options):
    stats = convert(tmp_path / "traces", tmp_path / "t.parquet", ConvertConfig(**options))
    spans = pq.read_table(tmp_path / "traces").to_pylist()
    response = {s["span_id"]: s["response_id"] for s in spans if s["operation_name"] == "chat"}
    got = pq.read_table(tmp_path / "t.parquet").to_pylist()
    return {response[t["span_id"]]: t["reward"] for t in got}, stats
