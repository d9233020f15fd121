"""Live prompt swap through MassGen's client: the real MassGen 0.1.97 (its own venv) under
AGL_BRIDGE_AUTO=1 with a prompt table, against the scripted server.

MassGen builds each agent's system message itself: its coordination instructions and the answers
so far, with the agent's own prompt (its configured ``system_message``) as one section,
``<agent_identity>``. The live version's text goes into that section, the rest of MassGen's
message is kept, and each chat span records the version and, apart from MassGen's message, the
text of that section (the agent's own prompt or the version placed): what APO reads as p0."""

import json
import os
import random
import re
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agl_bridge import semconv as sc
from agl_bridge.parquet_io import iter_parquet_files
from agl_bridge.trainer.loop.apo.config import ApoSearchConfig
from agl_bridge.trainer.loop.apo.run import Scoring, search_agent
from agl_bridge.trainer.loop.apo.transcripts import transcripts
from agl_bridge.trainer.loop.gate import Scores
from agl_bridge.trainer.serving.prompts import PromptRegistry
from tests.integrations.test_massgen_integration import massgen_script
from tests.massgen_venv import RUNNER
from tests.recording_optimizer import RecordingOptimizer
from tests.scripted_server import ScriptedServer

OWN = {"agent_a": "You are agent A's own prompt.", "agent_b": "You are agent B's own prompt."}
IDENTITY = re.compile(r"<agent_identity[^>]*>\s*(.*?)\s*</agent_identity>", re.S)


def run_team(massgen_python, work, prompts):
    """One MassGen run (agents with their own prompts) reading the table ``prompts`` (None: no
    table): the requests the server got and the chat spans, by agent."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
    env.update(AGL_BRIDGE_AUTO="1", AGL_BRIDGE_PARQUET_DIR=str(work / "traces"),
               AGL_BRIDGE_CAPTURE="messages", OPENAI_API_KEY="unused",
               LITELLM_LOCAL_MODEL_COST_MAP="True", OTEL_SERVICE_NAME="massgen-team",
               **({"AGL_BRIDGE_PROMPTS": str(prompts)} if prompts is not None else {}))
    work.mkdir()
    with ScriptedServer(vllm=True, script=massgen_script, completion_ids=[21, 22]) as server:
        out = subprocess.run([str(massgen_python), str(RUNNER), server.base_url,
                              json.dumps(OWN)], env=env, cwd=work, capture_output=True,
                             text=True, timeout=300)
        requests = list(server.requests)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["selected_agent"] == "agent_a"  # coordination still works: answers, votes
    rows = pa.concat_tables([pq.read_table(f) for f in iter_parquet_files(work / "traces")])
    chats = [r for r in rows.to_pylist() if r["operation_name"] == "chat"]
    by_agent = {a: [r for r in requests if r["model"] == f"m-{a}"] for a in OWN}
    spans = {a: [json.loads(r["attributes"]) for r in chats if r["agent_name"] == a]
             for a in OWN}
    assert all(by_agent.values()) and all(spans.values())
    return by_agent, spans, out.stderr


def system_text(request):
    (system,) = [m["content"] for m in request["messages"] if m["role"] == "system"]
    return system


def coordination(requests):
    """The coordination calls (those offered the vote tool)."""
    calls = [r for r in requests
             if "vote" in {t["function"]["name"] for t in r.get("tools") or []}]
    assert calls
    return calls


def identities(requests):
    """The agent identity section of each coordination call."""
    return {IDENTITY.search(system_text(r)).group(1) for r in coordination(requests)}


def test_published_version_reaches_massgen_agents_and_rollback_one_step(massgen_python,
                                                                        tmp_path):
    reg = PromptRegistry(tmp_path / "reg")
    one = "You are agent A, version one: check the sum twice."
    two = "You are agent A, version two: answer with the sum first."
    reg.publish("agent_a", one, note="test")
    reg.publish("agent_a", two, note="test")

    requests, spans, _ = run_team(massgen_python, tmp_path / "run1", reg.table_path)
    # agent_a's identity is the published version's text; MassGen's message is kept around it
    assert identities(requests["agent_a"]) == {two}
    assert all(OWN["agent_a"] not in system_text(r) for r in requests["agent_a"])
    assert all("<system_prompt>" in system_text(r) and len(system_text(r)) > 5 * len(two)
               for r in coordination(requests["agent_a"]))
    # the winner's presentation starts from its (swapped) prompt too
    assert all(two in system_text(r) for r in requests["agent_a"])
    # agent_b has no entry: its own prompt, untouched, recorded as p0
    assert identities(requests["agent_b"]) == {OWN["agent_b"]}
    assert {s[sc.PROMPT_VERSION] for s in spans["agent_a"]} == {"agent_a@p2"}
    assert {s[sc.PROMPT_VERSION] for s in spans["agent_b"]} == {"agent_b@p0"}

    reg.rollback("agent_a", "p1")  # one step back
    requests, spans, _ = run_team(massgen_python, tmp_path / "run2", reg.table_path)
    assert identities(requests["agent_a"]) == {one}
    assert {s[sc.PROMPT_VERSION] for s in spans["agent_a"]} == {"agent_a@p1"}

    reg.rollback("agent_a", "p0")  # its own prompt again
    requests, spans, _ = run_team(massgen_python, tmp_path / "run3", reg.table_path)
    assert identities(requests["agent_a"]) == {OWN["agent_a"]}
    assert {s[sc.PROMPT_VERSION] for s in spans["agent_a"]} == {"agent_a@p0"}


@pytest.mark.parametrize("content", ["{not json", '{"prompts": {"agent_a": {"version": "x"}}}'])
def test_a_table_that_cannot_be_used_never_fails_a_massgen_call(massgen_python, tmp_path,
                                                                content):
    table = tmp_path / "prompts.json"
    table.write_text(content)
    requests, spans, stderr = run_team(massgen_python, tmp_path / "run", table)
    assert identities(requests["agent_a"]) == {OWN["agent_a"]}  # its own prompt
    assert {s[sc.PROMPT_VERSION] for s in spans["agent_a"]} == {"agent_a@p0"}
    assert "AGL_BRIDGE_PROMPTS" in stderr  # reported, naming the variable


def test_apo_reads_a_massgen_agents_own_prompt_and_its_version_goes_to_the_identity(
        massgen_python, tmp_path):
    """APO on a MassGen team: traces captured with no prompt table record each agent's own
    prompt apart from MassGen's coordination message (the identity section's text), so the
    root APO keeps as p0, and what its optimizer rewrites, is that prompt; a version published
    from it is the identity section of the agent's next messages, MassGen's message kept."""
    requests, spans, _ = run_team(massgen_python, tmp_path / "run1", None)
    for agent, own in OWN.items():
        assert identities(requests[agent]) == {own}
        assert {s[sc.PROMPT_TEXT] for s in spans[agent]} == {own}
        assert all(sc.PROMPT_VERSION not in s for s in spans[agent])  # no table, no version
    traces = tmp_path / "run1" / "traces"
    episodes = {r["episode_id"] for f in iter_parquet_files(traces)
                for r in pq.read_table(f, columns=["episode_id"]).to_pylist()}
    pool = transcripts(traces, {e: 1.0 for e in episodes if e}, max_chars=100_000,
                       agent="agent_a")
    assert pool and all("<agent_identity" in t.text for t in pool)  # MassGen's message...
    assert {t.system for t in pool} == {OWN["agent_a"]}  # ...and the agent's own prompt apart

    reg = PromptRegistry(tmp_path / "reg")
    optimizer = RecordingOptimizer()
    searched = search_agent(
        "agent_a", pool, search=ApoSearchConfig(beam_width=1, branch_factor=1, beam_rounds=1),
        registry=reg, optimizer=optimizer,
        scoring=Scoring("unused", [{"task_id": "t1"}], "http://unused", None),
        work=tmp_path / "apo", rng=random.Random(0), others={}, source=str(traces),
        log=lambda _: None, root_scores=Scores({"t1": 1.0}))
    assert searched.root.text == reg.text("agent_a", "p0") == OWN["agent_a"]
    assert optimizer.prompts == [OWN["agent_a"]] * 2  # a candidate rewrites that part only

    better = "You are agent A, rewritten: add the numbers, then answer with the sum."
    reg.publish("agent_a", better, note="apo winner")  # agent_a@p1
    requests, spans, _ = run_team(massgen_python, tmp_path / "run2", reg.table_path)
    assert identities(requests["agent_a"]) == {better}
    assert all("<system_prompt>" in system_text(r) and len(system_text(r)) > 5 * len(better)
               and OWN["agent_a"] not in system_text(r) for r in coordination(requests["agent_a"]))
    assert {(s[sc.PROMPT_VERSION], s[sc.PROMPT_TEXT]) for s in spans["agent_a"]} == {
        ("agent_a@p1", better)}
    assert {(s[sc.PROMPT_VERSION], s[sc.PROMPT_TEXT]) for s in spans["agent_b"]} == {
        ("agent_b@p0", OWN["agent_b"])}
