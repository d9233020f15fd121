"""``agl-bridge replay``: the inputs of stored production episodes, played K times each by the
user's team command, become groups for group-relative training."""

import itertools
import os
import subprocess
import sys

import pyarrow.parquet as pq

from agl_bridge.cli import main
from agl_bridge.trainer.conversion import convert
from tests.paths import AGENTS
from tests.scripted_server import ScriptedServer


def captured_tickets(tmp_path, base_url):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
    out = subprocess.run([sys.executable, str(AGENTS / "ticket_app.py"), base_url],
                         env={**env, "AGL_BRIDGE_AUTO": "1", "AGL_BRIDGE_CAPTURE": "messages",
                              "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "production")},
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr


def test_replay_turns_single_episodes_into_groups_of_k(tmp_path, capsys):
    answers = itertools.cycle(["high", "low", "high priority", "no idea"])
    with ScriptedServer(vllm=True, script=lambda body: (next(answers), [])) as server:
        captured_tickets(tmp_path, server.base_url)
        first = {tuple(m["content"] for m in b["messages"]) for b in server.requests}
        server.requests.clear()
        code = main(["replay", str(tmp_path / "production"), "--team",
                     f"python {AGENTS / 'replay_team.py'}", "--out", str(tmp_path / "replay"),
                     "--base-url", server.base_url, "--replay-k", "4",
                     "--replay-field", "ticket.priority"])
    assert code == 0 and "3 of 3 stored episode(s) replayed x 4" in capsys.readouterr().out
    # every request replayed the stored one exactly, 4 times each
    sent = [tuple(m["content"] for m in b["messages"]) for b in server.requests]
    assert len(sent) == 12 and set(sent) == first
    assert all(sent.count(s) == 4 for s in first)
    stats = convert(tmp_path / "replay" / "spans", tmp_path / "t.parquet")
    t = pq.read_table(tmp_path / "t.parquet").to_pylist()
    groups = {}
    for row in t:
        groups.setdefault(row["task_id"], []).append(row["reward"])
    assert sorted(groups) == ["replay:ticket-0", "replay:ticket-1", "replay:ticket-2"]
    assert all(len(r) == 4 for r in groups.values())
    assert stats.groups == 3 and stats.zero_variance_groups < 3  # some groups carry signal
    assert any(a != 0.0 for a in (row["advantage"] for row in t))


def test_episodes_without_an_input_are_named_not_replayed(tmp_path, capsys):
    with ScriptedServer(vllm=True) as server:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
        out = subprocess.run([sys.executable, str(AGENTS / "ticket_app.py"), server.base_url],
                             env={**env, "AGL_BRIDGE_AUTO": "1",  # token ids only: no messages
                                  "AGL_BRIDGE_PARQUET_DIR": str(tmp_path / "production")},
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        code = main(["replay", str(tmp_path / "production"), "--team", "python -c pass",
                     "--out", str(tmp_path / "replay"), "--base-url", server.base_url])
    captured = capsys.readouterr()
    assert code == 1 and "0 of 3 stored episode(s) replayed" in captured.out
    assert "episode ticket-0: no captured request messages (not replayed)" in captured.err


def test_traces_without_an_llm_call_are_not_episodes_to_replay():
    """A framework's own spans outside any episode (no episode id, no chat) are neither
    replayed nor reported as episodes without an input: the loop's counts stay true."""
    import json

    from agl_bridge.trainer.loop.replay import replay_inputs
    from tests.factories import llm, table

    rows = []
    for i, episode in enumerate(("e1", "e2")):
        row = llm(episode, 10 + i, task=f"req-{i}", trace=f"t{i}")
        row["attributes"] = json.dumps({"demo.question": f"{i} + 1"})
        rows.append(row)
    rows.append({"trace_id": "bg", "span_id": "x1", "name": "autogen publish",
                 "operation_name": None, "start_time_unix_nano": 5, "episode_id": None})
    inputs = replay_inputs(table(rows), field_name="demo.question")
    assert inputs.episodes == 2 and inputs.without_input == []
    assert [t["demo.question"] for t in inputs.tasks] == ["0 + 1", "1 + 1"]
    assert [t["task_id"] for t in inputs.tasks] == ["replay:req-0", "replay:req-1"]
