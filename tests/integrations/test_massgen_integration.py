"""The real MassGen 0.1.97 (its own venv: it pins openai 2.2.0) captured with AGL_BRIDGE_AUTO=1,
two agents against a scripted server that makes them answer, vote and present."""

import json
import os
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq

from agl_bridge import semconv as sc
from agl_bridge.parquet_io import iter_parquet_files
from tests.massgen_venv import RUNNER, call
from tests.scripted_server import ScriptedServer


def massgen_script(body):
    """Answer while no answer exists, then vote for agent1; the winner presents."""
    tools = {t["function"]["name"] for t in body.get("tools") or []}
    text = json.dumps(body.get("messages"))
    if "vote" in tools:
        if "(no answers available yet)" in text:
            return "", [call("new_answer", content="2 + 3 = 5")]
        return "", [call("vote", agent_id="agent1", reason="agent1 shows the sum")]
    if "new_answer" in tools:
        return "", [call("new_answer", content="The answer is 5.")]
    return "5", []


def test_answers_votes_and_winner_are_captured_with_agent_and_round(massgen_python, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
    env.update(AGL_BRIDGE_AUTO="1", AGL_BRIDGE_PARQUET_DIR=str(tmp_path / "traces"),
               AGL_BRIDGE_CAPTURE="messages", OPENAI_API_KEY="unused",
               LITELLM_LOCAL_MODEL_COST_MAP="True", OTEL_SERVICE_NAME="massgen-team")
    with ScriptedServer(vllm=True, script=massgen_script, completion_ids=[21, 22]) as server:
        out = subprocess.run([str(massgen_python), str(RUNNER), server.base_url], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["selected_agent"] == "agent_a"  # a failed backend would give None

    files = list(iter_parquet_files(tmp_path / "traces"))
    rows = pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()
    chats = [r for r in rows if r["operation_name"] == "chat"]
    assert {r["agent_name"] for r in chats} == {"agent_a", "agent_b"}
    assert all(r["completion_token_ids"] == [21, 22] and r["prompt_token_ids"] for r in chats)
    assert len({r["episode_id"] for r in rows if r["episode_id"]}) == 1
    for agent in ("agent_a", "agent_b"):  # each call is one more turn of its agent
        turns = sorted(r["turn_index"] for r in chats if r["agent_name"] == agent)
        assert turns == list(range(len(turns)))
    assert all(r["coordination_round"] is not None for r in chats)  # a promoted column

    def named(span_name):
        return [r for r in rows if r["name"] == span_name]

    answers = named(sc.SPAN_NEW_ANSWER)
    assert {json.loads(r["attributes"])[sc.COORDINATION_AGENT] for r in answers} == {
        "agent_a", "agent_b"}
    votes = [json.loads(r["attributes"]) for r in named(sc.SPAN_VOTE)]
    assert {(v[sc.VOTE_VOTER], v[sc.VOTE_TARGET]) for v in votes} >= {
        ("agent_a", "agent_a"), ("agent_b", "agent_a")}
    assert all(v[sc.VOTE_REASON] == "agent1 shows the sum" for v in votes)
    (final,) = named(sc.SPAN_FINAL_SELECTION)
    final_attrs = json.loads(final["attributes"])
    assert final_attrs[sc.COORDINATION_AGENT] == "agent_a"
    assert json.loads(final_attrs[sc.VOTE_COUNTS]) == {"agent_a": 2}
