"""docs/own-team.md, start to finish: the unchanged AutoGen program
(examples/autogen_selector_team.py) captured, scored after the fact by response id, converted,
trained into one adapter per agent, published, and run again with each agent routed to its own
adapter although all share one model client.

The fast test plays the guide against the scripted server (vLLM's token ids and runtime-LoRA
endpoints, a script that makes the selector pick each agent and the tool agents call their
tools). The e2e test runs the guide's own shell blocks, as written, on a real vLLM."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.trainer.conversion import ConvertConfig, convert
from agl_bridge.trainer.serving.publisher import Publisher
from tests.paths import EXAMPLES, ROOT
from tests.scripted_server import ScriptedServer

PROGRAM = EXAMPLES / "autogen_selector_team.py"
GUIDE = ROOT / "docs" / "own-team.md"
AGENTS = ("PlanningAgent", "WebSearchAgent", "DataAnalystAgent")
SELECTOR = "SelectorGroupChatManager"  # the agent the integration names the selector's calls
BIN = Path(sys.executable).parent
TASKS = ["Which Heat player scored most in 2006-2007, and how did his rebounds change "
         "from 2007-2008 to 2008-2009?", "How did the Heat's wins change from 2005-2006?"]


def guide_blocks() -> list[str]:
    """The guide's shell blocks, in order: the commands a newcomer types."""
    return re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S)


# -- the scripted team: who speaks, and what they say --------------------------------------------
def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    return content if isinstance(content, str) else " ".join(
        part.get("text", "") for part in content if isinstance(part, dict))


def speaker_of(body: dict[str, Any]) -> str | None:
    """Which agent sent this request: the selector, the agent whose system message it is, or
    None (the publisher's probe)."""
    first = _text(body["messages"][0])
    if "Select an agent to do the next step" in first:
        return SELECTOR
    for agent, marker in (("PlanningAgent", "planning agent"), ("WebSearchAgent", "web search"),
                          ("DataAnalystAgent", "data analyst")):
        if marker in first:
            return agent
    return None


def script(body: dict[str, Any]) -> tuple[str, list[dict[str, str]]]:
    """The guide's run, as a capable model would play it: plan, search, compute, summarise."""
    who = speaker_of(body)
    if who is None:
        return "pong", []
    if who == SELECTOR:
        spoken = re.findall(r"^(PlanningAgent|WebSearchAgent|DataAnalystAgent):",
                            _text(body["messages"][0]), flags=re.M)
        last = spoken[-1] if spoken else None
        following = {None: "PlanningAgent", "PlanningAgent": "WebSearchAgent",
                     "WebSearchAgent": "DataAnalystAgent", "DataAnalystAgent": "PlanningAgent"}
        return following[last], []
    if who == "WebSearchAgent":
        return "", [{"id": f"call_s{len(body['messages'])}", "name": "search_web_tool",
                     "arguments": json.dumps({"query": "Heat points 2006-2007"})}]
    if who == "DataAnalystAgent":
        return "", [{"id": f"call_d{len(body['messages'])}", "name": "percentage_change_tool",
                     "arguments": json.dumps({"start": 214, "end": 398})}]
    if any(m.get("name") == "DataAnalystAgent" for m in body["messages"]):
        return "Wade's rebounds went up 86%. TERMINATE", []
    return "1. WebSearchAgent : find the numbers\n2. DataAnalystAgent : compute the change", []


def ids_for(body: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Token ids the tiny model has (vocabulary 320): the prompt grows with the conversation."""
    n, who = len(body["messages"]), speaker_of(body)
    agent = AGENTS.index(who) if who in AGENTS else 3
    return [257, *range(40, 40 + n), 258], [60 + n % 50, 70 + agent, 258]


def run_program(server: ScriptedServer, work: Path, traces: Path, *tasks: str,
                **env: str) -> subprocess.CompletedProcess:
    """The example as a user runs it: its own process, configured by the environment only."""
    out = subprocess.run(
        [sys.executable, str(PROGRAM), *tasks], cwd=work, capture_output=True, text=True,
        timeout=120, env={**os.environ, "AGL_BRIDGE_AUTO": "1",
                          "AGL_BRIDGE_PARQUET_DIR": str(traces),
                          "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "unused", **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def read_spans(traces: Path) -> list[dict[str, Any]]:
    rows = pq.read_table(sorted(traces.rglob("*.parquet"))).to_pylist()
    for row in rows:
        row["attrs"] = json.loads(row["attributes"] or "{}")
    return rows


def calls(log: Path) -> list[dict[str, Any]]:
    """The program's own log: one line per model call, AutoGen's LLMCallEvent."""
    return [json.loads(line) for line in log.read_text().splitlines()]


def agent_of(call: dict[str, Any]) -> str:
    return (call.get("agent_id") or "").split("/", 1)[0].rsplit("_", 1)[0]


# -- the fast test: the guide against the scripted server ----------------------------------------
def test_guide_on_the_scripted_server(tiny, tmp_path):
    traces, routed = tmp_path / "traces", tmp_path / "traces-routed"
    with ScriptedServer(vllm=True, lora=True, unique_ids=True, script=script,
                        ids_for=ids_for) as server:
        # 2. capture: the unchanged program, zero-code
        run_program(server, tmp_path, traces, *TASKS)
        base_requests = list(server.requests)
        spoke = Counter(speaker_of(b) for b in base_requests)
        assert set(spoke) == {*AGENTS, SELECTOR}, spoke
        assert {b["model"] for b in base_requests} == {"base"}

        # 3. late feedback by response id: the guide's own block (a stand-in reviewer's CSV)
        logged = [c for c in calls(tmp_path / "llm_calls.jsonl") if agent_of(c) in AGENTS]
        assert {agent_of(c) for c in logged} == set(AGENTS)
        fed = subprocess.run(["bash", "-e", "-c", guide_blocks()[3]], cwd=tmp_path, timeout=60,
                             capture_output=True, text=True,
                             env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
        assert fed.returncode == 0, fed.stderr
        scores = {r["id"]: float(r["value"])
                  for r in csv.DictReader(open(tmp_path / "scores.csv"))}
        assert set(scores) == {c["response"]["id"] for c in logged}
        assert len(set(scores.values())) > 1  # something for the batch baseline to compare

        # conversion: each score reached exactly its call's agent and turn
        stats = convert(traces, tmp_path / "transitions.parquet",
                        ConvertConfig())  # the default baseline: group, then batch
        rows = pq.read_table(tmp_path / "transitions.parquet").to_pylist()
        by_span = {r["span_id"]: r for r in read_spans(traces)
                   if r["name"].startswith("chat ")}
        scored = {}
        for row in rows:
            response_id = by_span[row["span_id"]]["response_id"]
            if response_id in scores:
                scored[response_id] = (row["agent_name"], row["reward"])
        assert scored == {rid: (agent_of(c), scores[rid])
                          for c in logged for rid in [c["response"]["id"]]}, stats
        assert len({r["episode_id"] for r in rows}) == 2  # one episode per team run
        assert stats.episodes == 2  # autogen-core's runtime traces are no episodes (29.9)
        assert set(stats.baselines) == {"batch"}  # no task repeats: group falls back to batch

        # 4. train: one adapter per agent, on the tiny model
        run = agl_bridge.train_from_traces(
            traces, tiny, policy="per_agent_lora",
            output_dir=tmp_path / "run", learning_rate=1e-2, progress=False)
        assert set(AGENTS) <= set(run.adapters), run.adapters

        # 5. publish each agent's adapter under its own alias
        publisher = Publisher([server.base_url], tmp_path / "reg", base_model=tiny)
        for agent in AGENTS:
            assert publisher.publish(run.adapters[agent], alias=agent) == f"{agent}@v1"
        assert {f"{a}@v1" for a in AGENTS} <= set(server.adapters)

        # 6. the same program again, each agent routed to its own adapter
        server.requests.clear()
        run_program(server, tmp_path, routed, TASKS[0],
                    AGL_BRIDGE_ALIASES=str(tmp_path / "reg" / "aliases.json"),
                    AGL_BRIDGE_ROUTE_BY="agent", LLM_CALL_LOG=str(tmp_path / "routed.jsonl"))
        seen = {(speaker_of(b), b["model"]) for b in server.requests}
        assert seen == {*((a, f"{a}@v1") for a in AGENTS), (SELECTOR, "base")}, seen

    # 7. what the spans say: alias asked, version that answered
    chats = [r for r in read_spans(routed) if r["name"].startswith("chat ")]
    for row in chats:
        if row["agent_name"] in AGENTS:
            assert row["attrs"][sc.POLICY_ALIAS] == row["agent_name"]
            assert row["attrs"][sc.GEN_AI_RESPONSE_MODEL] == f"{row['agent_name']}@v1"
            assert row["policy_version"] == f"{row['agent_name']}@v1"
        else:
            assert sc.POLICY_ALIAS not in row["attrs"]
    assert {r["agent_name"] for r in chats} == {*AGENTS, SELECTOR}


# -- the e2e test: the guide's own shell blocks on a real vLLM -----------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_models(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as answer:
        return {m["id"] for m in json.load(answer)["data"]}


def test_every_block_of_the_guide_holds_a_command_the_e2e_test_runs():
    blocks = guide_blocks()
    assert [b.split()[0] for b in blocks] == [
        "python", "agl-bridge", "AGL_BRIDGE_AUTO=1", "python", "agl-bridge", "for",
        "AGL_BRIDGE_AUTO=1", "python"]
    assert "agl-bridge serve" in blocks[1] and "--tool-call-parser hermes" in blocks[1]
    assert "AGL_BRIDGE_ROUTE_BY=agent" in blocks[6] and "AGL_BRIDGE_ROUTE_BY" not in blocks[2]
    assert "--policy per_agent_lora" in blocks[4]


@pytest.mark.e2e
def test_the_guide_as_written_on_vllm(tmp_path):
    """Each block runs in a fresh directory standing for the clone's root (examples/ linked),
    with .venv's commands first on PATH; only the port differs (a free one for 8000). The serve
    block runs in the background, as in the guide's second terminal. After the guide, the
    command line goes on against the same server: a second version published, a rollback, a
    version never published refused, and serve stopped by SIGTERM exits 0 (once a test of its
    own, with a vLLM of its own)."""
    port = free_port()
    blocks = [b.replace("8000", str(port)) for b in guide_blocks()]
    (tmp_path / "examples").symlink_to(EXAMPLES)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}

    def run(block: str, timeout: int) -> str:
        out = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, timeout=timeout,
                             capture_output=True, text=True, errors="replace")
        assert out.returncode == 0, f"{block}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
        return out.stdout

    run(blocks[0], 120)  # 0. the model
    serve = subprocess.Popen(["bash", "-c", "exec " + blocks[1]], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace")
    try:
        assert serve.stdout is not None
        deadline = time.monotonic() + 240
        for line in serve.stdout:  # 1. serve: it prints the URL once vLLM answers
            if line.startswith("replica 0: http://127.0.0.1:"):
                break
            assert time.monotonic() < deadline, "vLLM did not start"
        else:
            log = (tmp_path / "reg" / "vllm-0.log").read_text()
            raise AssertionError(f"serve exited: {log[-3000:]}")
        assert served_models(port) == {"base"}

        run(blocks[2], 240)  # 2. capture
        run(blocks[3], 60)  # 3. scores by response id, imported as feedback
        trained = run(blocks[4], 300)  # 4. train
        assert "baselines: batch" in trained
        published = run(blocks[5], 120)  # 5. publish
        loaded = served_models(port)
        run(blocks[6], 240)  # 6. the same program, routed by agent
        looked = run(blocks[7], 120)  # 7. look

        # the commands go on: the planner's second version (its first, copied) goes live, the
        # rollback makes the first live again, and a version never published is refused
        agent = "PlanningAgent"
        first = tmp_path / "runs" / "heat-team" / "adapters" / agent / "v0001"
        shutil.copytree(first, first.with_name("v0002"))

        def cli(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(BIN / "agl-bridge"), *args, "--registry", "reg/"],
                                  cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=120)

        second = cli("publish", str(first.with_name("v0002")), "--alias", agent)
        back = cli("rollback", agent, "v1")
        missing = cli("rollback", agent, "v9")
    finally:
        serve.terminate()
        stopped = serve.wait(timeout=60)

    assert stopped == 0  # SIGTERM: serve stops its vLLM and exits cleanly
    assert f"alias {agent} -> {agent}@v1" in published
    assert second.returncode == 0 and f"alias {agent} -> {agent}@v2" in second.stdout, \
        second.stderr[-2000:]
    assert back.returncode == 0 and back.stdout.strip() == f"alias {agent} -> {agent}@v1"
    assert missing.returncode == 2 and f"{agent}@v9 was never published" in missing.stderr

    # feedback joined: each scored response id reached its own call's transition, that reward
    scores = {r["id"]: float(r["value"]) for r in csv.DictReader(open(tmp_path / "scores.csv"))}
    assert scores
    responses = {r["span_id"]: r["response_id"] for r in read_spans(tmp_path / "traces")}
    transitions = pq.read_table(tmp_path / "runs" / "heat-team" / "transitions.parquet")
    rewarded = {responses[t["span_id"]]: t["reward"] for t in transitions.to_pylist()
                if responses[t["span_id"]] in scores}
    assert rewarded == pytest.approx(scores)

    # the agents that spoke (the random model: the planner, by AutoGen's fallback) were trained,
    # published, loaded and routed; the selector, with no alias, stayed on the base model
    spoke = {agent_of(c) for c in calls(tmp_path / "llm_calls.jsonl")} & set(AGENTS)
    assert "PlanningAgent" in spoke
    aliases = json.loads((tmp_path / "reg" / "aliases.json").read_text())["aliases"]
    assert aliases == {a: f"{a}@v1" for a in spoke}
    assert set(aliases.values()) <= loaded
    chats = [r for r in read_spans(tmp_path / "traces-routed") if r["name"].startswith("chat ")]
    assert {r["agent_name"] for r in chats} == {*spoke, SELECTOR}
    for row in chats:
        alias = row["attrs"].get(sc.POLICY_ALIAS)
        answered = row["attrs"][sc.GEN_AI_RESPONSE_MODEL]
        if row["agent_name"] == SELECTOR:
            assert (alias, answered) == (None, "base")
        else:
            assert (alias, answered) == (row["agent_name"], f"{row['agent_name']}@v1")
    assert "PlanningAgent 0 PlanningAgent PlanningAgent@v1" in looked
    assert (tmp_path / "runs" / "heat-team" / "report" / "report.html").exists()
