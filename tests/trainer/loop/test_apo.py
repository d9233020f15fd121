"""APO from traces (issue 33, item 3): ``agl-bridge apo``'s search on a scripted optimizer, on
the scripted server, with a real team command under zero-code capture and the live prompt
swap: stored rewarded episodes are critiqued, rewrites scored on held-out tasks, the gate
publishes only a candidate not worse beyond noise, and every candidate's text, score and diff
are kept. No torch is needed: nothing here imports it."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from agl_bridge import semconv as sc
from agl_bridge.cli import main
from agl_bridge.trainer.loop.apo.config import ApoConfig, ApoSearchConfig
from agl_bridge.trainer.loop.apo.optimizer import (
    CRITIQUE_SYSTEM,
    REWRITE_SYSTEM,
    parse_rewrite,
)
from agl_bridge.trainer.loop.apo.run import ApoError, Scoring, run_apo, search_agent
from agl_bridge.trainer.loop.apo.search import Candidate, beam_search, best
from agl_bridge.trainer.loop.apo.transcripts import Transcript, best_and_worst, transcripts
from agl_bridge.trainer.loop.apo.versions import episode_prompt_versions
from agl_bridge.trainer.loop.gate import Scores
from agl_bridge.trainer.loop.team import run_team
from agl_bridge.trainer.serving.prompts import PromptRegistry
from tests.factories import llm, openinference_call, reward, table
from tests.paths import AGENTS
from tests.recording_optimizer import RecordingOptimizer
from tests.scripted_server import ScriptedServer

TEAM = f"{sys.executable} {AGENTS / 'apo_team.py'}"
GOOD = "Reply with the number you are asked to say, digits only."


class World:
    """The scripted server's answers: the team's solver says the number only when its system
    prompt mentions digits; the optimizer critiques and rewrites from a list."""

    def __init__(self, rewrites: list[str]) -> None:
        self.rewrites = list(rewrites)
        self.critiques: list[str] = []  # what each critique request showed
        self.team_systems: list[str] = []

    def __call__(self, body):
        system = body["messages"][0]["content"]
        if system == CRITIQUE_SYSTEM:
            self.critiques.append(body["messages"][1]["content"])
            return "The replies never say the number.", []
        if system == REWRITE_SYSTEM:
            text = self.rewrites.pop(0) if self.rewrites else "You are a helpful assistant."
            return f"Here it is:\n<prompt>{text}</prompt>", []
        self.team_systems.append(system)
        number = re.search(r"say (\d+)", body["messages"][-1]["content"]).group(1)
        if "ten only" in system:  # a rewrite that helps on one task of six
            return (number if number == "10" else "hello"), []
        return (number if "digits" in system else "hello"), []


def tasks_file(path, n):
    path.write_text("".join(json.dumps({"task_id": f"t{i}", "number": 10 + i}) + "\n"
                            for i in range(n)))
    return path


def stored_traces(tmp_path, server):
    """What production left: the team on its own prompt, rewarded, captured with messages."""
    run = run_team(TEAM, [{"task_id": f"s{i}", "number": 40 + i} for i in range(4)],
                   tmp_path / "stored", base_url=server.base_url, aliases=None,
                   extra_env={"AGL_BRIDGE_CAPTURE": "messages"})
    return run.spans


def config(tmp_path, server, **kw):
    return ApoConfig(agents=["solver"], registry=str(tmp_path / "reg"), team=TEAM,
                     val_tasks=str(tasks_file(tmp_path / "val.jsonl", 6)),
                     base_url=server.base_url, **kw)


def test_a_better_prompt_is_found_gated_and_published(tmp_path):
    world = World(["Be polite.", GOOD, "Be brief.", "Be polite."])
    with ScriptedServer(vllm=True, script=world) as server:
        traces = stored_traces(tmp_path, server)
        out = run_apo(traces, config(tmp_path, server, beam_width=2, branch_factor=2,
                                     beam_rounds=2), tmp_path / "apo")
    (o,) = out
    assert o.published == "solver@p1" and o.root == "solver@p0"
    assert o.gate["publish"] and o.gate["team"]["difference"] == pytest.approx(1.0)
    reg = PromptRegistry(tmp_path / "reg")
    assert reg.text("solver", "p1") == GOOD
    assert reg.text("solver", "p0") == "You are a helpful assistant."  # its own, from traces
    table = json.loads((tmp_path / "reg/prompts.json").read_text())["prompts"]
    assert table == {"solver": {"version": "solver@p1", "text": GOOD}}
    # the first critique read the stored episodes, with their rewards
    assert "say 40" in world.critiques[0] and "reward 0" in world.critiques[0]
    # every candidate kept: text, score, diff against the root; the held-out runs used them
    rows = [json.loads(line) for line in (tmp_path / "apo/solver/candidates.jsonl")
            .read_text().splitlines()]
    by_text = {r["text"]: r for r in rows}
    assert by_text[GOOD]["mean"] == 1.0 and by_text["Be polite."]["mean"] == 0.0
    assert by_text["You are a helpful assistant."]["id"] == "root"
    assert "+" + GOOD in by_text[GOOD]["diff"] and by_text[GOOD]["critique"]
    assert len(rows) == len(by_text)  # the duplicate "Be polite." was not scored twice
    winner = by_text[GOOD]["id"]
    assert (tmp_path / f"apo/solver/{winner}/prompt.txt").read_text() == GOOD
    assert world.team_systems.count(GOOD) == 6  # the swap gave the solver the candidate
    history = json.loads((tmp_path / "reg/prompt_history.json").read_text())["solver"]
    assert "held-out 1.000 vs 0.000" in history[-1]["note"]
    # the spans say which prompt version served each episode
    root_runs = episode_prompt_versions(tmp_path / "apo/solver/root/spans")
    assert len(root_runs) == 6 and set(root_runs.values()) == {"solver@p0"}
    assert set(episode_prompt_versions(tmp_path / f"apo/solver/{winner}/spans").values()) == \
        {"solver@p1"}
    assert episode_prompt_versions(traces) == {}  # stored before any table was set


def test_nothing_worse_is_published(tmp_path):
    """Also: the held-out runs follow the alias table given (the loop's live adapters)."""
    world = World(["Be polite.", "Be brief."])
    (tmp_path / "aliases.json").write_text(json.dumps({"aliases": {"base": "solver@v3"}}))
    with ScriptedServer(vllm=True, script=world) as server:
        traces = stored_traces(tmp_path, server)
        stored = len(server.requests)
        (o,) = run_apo(traces, config(tmp_path, server, beam_width=1, branch_factor=2,
                                      beam_rounds=1), tmp_path / "apo",
                       aliases=tmp_path / "aliases.json")
    team = [b for b in server.requests[stored:]
            if b["messages"][0]["content"] not in (CRITIQUE_SYSTEM, REWRITE_SYSTEM)]
    assert len(team) == 18 and {b["model"] for b in team} == {"solver@v3"}
    assert o.published is None and o.best == "root"
    assert not (tmp_path / "reg/prompts.json").exists()  # no table: agents keep their own
    assert len((tmp_path / "apo/solver/candidates.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize("rule, published", [("better", None), ("not_worse", "solver@p1")])
def test_a_gain_within_noise_passes_not_worse_only(tmp_path, rule, published):
    """The best candidate is right on 1 task of 6 where the root is right on none: +0.17,
    95% interval [-0.16, +0.49]. ``better`` wants the interval above 0: refused."""
    world = World(["Say digits for ten only."])
    with ScriptedServer(vllm=True, script=world) as server:
        traces = stored_traces(tmp_path, server)
        (o,) = run_apo(traces, config(tmp_path, server, beam_width=1, branch_factor=1,
                                      beam_rounds=1, rule=rule), tmp_path / "apo")
    assert o.best == "r1c1" and o.published == published
    assert o.gate["team"]["difference"] == pytest.approx(1 / 6)
    assert o.gate["team"]["low"] < 0 < o.gate["team"]["high"]
    assert (tmp_path / "reg/prompts.json").exists() == (published is not None)


def test_a_tie_with_the_live_version_publishes_nothing(tmp_path):
    """Candidate and the live version tie on every task: the live one ranks first (fewer
    rewrites away), nothing is published, the live version stays."""
    world = World(["Answer in digits, please."])
    with ScriptedServer(vllm=True, script=world) as server:
        traces = stored_traces(tmp_path, server)
        reg = PromptRegistry(tmp_path / "reg")
        reg.publish("solver", "Say it in digits.")  # the live version already scores 1.0
        (o,) = run_apo(traces, config(tmp_path, server, beam_width=1, branch_factor=1,
                                      beam_rounds=1, rule="better"), tmp_path / "apo")
    assert o.root == "solver@p1" and o.published is None and o.best == "root"
    assert json.loads((tmp_path / "reg/prompts.json").read_text())["prompts"]["solver"][
        "version"] == "solver@p1"


def test_beam_search_widths_rounds_and_duplicates():
    scores = {"root": 0.2, "a": 0.5, "b": 0.1, "c": 0.9, "d": 0.4}
    proposals = iter(["a", "b", "a", "c", "d", "b", "c", "d"])
    critiqued = []

    def evaluate(c):
        return Scores({"t1": scores[c.text], "t2": scores[c.text]}), []

    tried = beam_search(Candidate("root", "root", 0), evaluate=evaluate,
                        critique=lambda c: critiqued.append(c.id) or f"critique of {c.id}",
                        rewrite=lambda c, crit: next(proposals, None),
                        beam_width=2, branch_factor=2, rounds=2)
    assert [c.text for c in tried] == ["root", "a", "b", "c", "d"]
    # round 1 critiques the root; round 2 the beam (a 0.5, root 0.2)
    assert critiqued == ["root", "r1c1", "root"]
    assert best(tried).text == "c" and best(tried).parent == "r1c1"
    assert [c.round for c in tried] == [0, 1, 1, 2, 2]
    assert math.isnan(Candidate("x", "x", 0).mean)


def test_rewrites_are_read_with_or_without_tags():
    assert parse_rewrite("sure:\n<prompt>\nNew one.\n</prompt> done") == "New one."
    assert parse_rewrite("<prompt>cut short") == "cut short"
    assert parse_rewrite("  Just the prompt.  ") == "Just the prompt."
    assert parse_rewrite("<prompt> </prompt>") is None


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(ApoError, match="apo needs registry, team, val_tasks, base_url, agents"):
        run_apo(tmp_path, ApoConfig(), tmp_path / "w")
    with pytest.raises(ValueError, match="beam_width must be at least 1, got 0"):
        ApoConfig(beam_width=0)
    (tmp_path / "val.jsonl").write_text('{"task_id": "a"}\n[1]\n')
    cfg = ApoConfig(agents=["solver"], registry=str(tmp_path / "reg"), team="python x",
                    val_tasks=str(tmp_path / "val.jsonl"), base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ApoError, match=r"val\.jsonl:2: a task needs a string task_id"):
        run_apo(tmp_path, cfg, tmp_path / "w")


def test_critiques_see_the_best_and_the_worst():
    pool = [Transcript(f"e{i}", "t", float(i), f"text {i}") for i in range(10)]
    good, bad = best_and_worst(pool, 4, random.Random(0))
    assert [t.reward for t in good] == [9.0, 8.0] and [t.reward for t in bad] == [0.0, 1.0]
    good, bad = best_and_worst(pool[:1], 4, random.Random(0))
    assert (len(good), bad) == (1, [])


def test_the_commands(tmp_path, capsys):
    """``agl-bridge apo`` from a TOML file, then ``agl-bridge prompts`` on what it published:
    history, diff, rollback to the agent's own prompt, publish from a file."""
    world = World([GOOD])
    with ScriptedServer(vllm=True, script=world) as server:
        traces = stored_traces(tmp_path, server)
        (tmp_path / "apo.toml").write_text(
            f'agents = ["solver"]\nregistry = "{tmp_path / "reg"}"\nteam = "{TEAM}"\n'
            f'val_tasks = "{tasks_file(tmp_path / "val.jsonl", 4)}"\n'
            f'base_url = "{server.base_url}"\nbeam_width = 1\nbranch_factor = 1\n'
            f'beam_rounds = 1\n')
        assert main(["apo", str(traces), "--workdir", str(tmp_path / "w"), "--config",
                     str(tmp_path / "apo.toml")]) == 0
    assert "solver: 2 candidates from solver@p0, best r1c1: published solver@p1" in \
        capsys.readouterr().out
    assert json.loads((tmp_path / "w/apo.settings.json").read_text())["apo"]["beam_width"] == 1
    reg = ["--registry", str(tmp_path / "reg")]
    assert main(["prompts", "history", *reg]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[:2] for line in out] == [["solver@p0", "recorded"],
                                                      ["solver@p1", "live"]]
    assert main(["prompts", "diff", "solver", "p0", "p1", *reg]) == 0
    assert f"+{GOOD}" in capsys.readouterr().out
    assert main(["prompts", "rollback", "solver", "p0", *reg]) == 0
    assert capsys.readouterr().out.strip() == "solver -> solver@p0"
    (tmp_path / "mine.txt").write_text("Mine.")
    assert main(["prompts", "publish", "solver", str(tmp_path / "mine.txt"), *reg]) == 0
    assert "solver -> solver@p2" in capsys.readouterr().out
    assert main(["prompts", "rollback", "solver", "p9", *reg]) == 2
    assert "solver@p9 was never published" in capsys.readouterr().err
    assert main(["prompts", "diff", "solver", "p1", *reg]) == 2
    assert "prompts diff takes AGENT OLD NEW" in capsys.readouterr().err


def test_apo_imports_no_torch():
    code = ("import sys; import agl_bridge.trainer.loop.apo.run, agl_bridge.cli; "
            "sys.exit(bool({'torch', 'transformers', 'peft', 'vllm'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# -- traces without token ids: APO reads text ------------------------------------------------
def test_traces_from_a_hosted_api_without_token_ids(tmp_path):
    """A server that returns no token ids (a hosted API): the stored episodes are still
    rewarded (their inline rewards, through conversion) and read as text."""
    world = World(["Be polite.", GOOD])
    logs: list[str] = []
    with ScriptedServer(vllm=False, script=world) as server:
        traces = stored_traces(tmp_path, server)
        rows = [r for r in pq.read_table(traces).to_pylist() if r["operation_name"] == "chat"]
        assert len(rows) == 4 and all(r["prompt_token_ids"] is None for r in rows)
        (o,) = run_apo(traces, config(tmp_path, server, beam_width=1, branch_factor=2,
                                      beam_rounds=1), tmp_path / "apo", log=logs.append)
    assert "4 LLM calls have no token ids (a hosted API, another instrumentor): read as text" \
        in logs
    assert "solver: 4 rewarded episodes; root solver@p0" in logs
    assert "say 40" in world.critiques[0] and "reward 0" in world.critiques[0]
    assert o.published == "solver@p1"
    reg = PromptRegistry(tmp_path / "reg")
    assert reg.text("solver", "p0") == "You are a helpful assistant."  # from the traces
    assert reg.text("solver", "p1") == GOOD
    assert not list(traces.rglob("*placeholder*"))  # the stored traces are left as they were
    assert all(r["prompt_token_ids"] is None for r in pq.read_table(traces).to_pylist()
               if r["operation_name"] == "chat")


def test_agl_bridge_apo_on_another_instrumentors_traces(tmp_path, capsys):
    """OpenInference spans (each session of two requests, two traces, is one episode),
    rewarded by reward spans in their traces: ``agl-bridge apo`` critiques them as text and
    publishes a better prompt."""
    rows = []
    for s, (answer, value) in enumerate([("40", 1.0), ("hello", 0.0)]):
        for k in range(2):
            trace = f"{s}{k}".ljust(32, "a")
            rows.append(openinference_call(trace, 10 * s + k, f"sess-{s}", f"say 4{s}",
                                           answer))
        rows.append(reward(None, 10 * s + 5, value, trace=trace))
    (tmp_path / "foreign").mkdir()
    pq.write_table(table(rows), tmp_path / "foreign/spans.parquet")
    world = World([GOOD])
    with ScriptedServer(vllm=False, script=world) as server:
        (tmp_path / "apo.toml").write_text(
            f'agents = ["solver"]\nregistry = "{tmp_path / "reg"}"\nteam = "{TEAM}"\n'
            f'val_tasks = "{tasks_file(tmp_path / "val.jsonl", 4)}"\n'
            f'base_url = "{server.base_url}"\nbeam_width = 1\nbranch_factor = 1\n'
            f'beam_rounds = 1\n')
        assert main(["apo", str(tmp_path / "foreign"), "--workdir", str(tmp_path / "w"),
                     "--config", str(tmp_path / "apo.toml")]) == 0
    captured = capsys.readouterr()
    assert "4 LLM calls have no token ids" in captured.err
    assert "solver: 2 rewarded episodes; root solver@p0" in captured.err  # the two sessions
    assert "solver: 2 candidates from solver@p0, best r1c1: published solver@p1" in captured.out
    critique = world.critiques[0]  # the best and the worst session, each with both replies
    assert "say 40" in critique and "say 41" in critique
    assert critique.count("[solver] assistant: 40") == 2
    assert critique.count("[solver] assistant: hello") == 2
    assert "reward 1" in critique and "reward 0" in critique
    reg = PromptRegistry(tmp_path / "reg")
    assert reg.text("solver", "p0") == "You are a helpful assistant."
    assert reg.text("solver", "p1") == GOOD


# -- a framework's message around the agent's own prompt (MassGen) ---------------------------


def massgen_call(episode, t, agent, own):
    """A MassGen agent's chat span: its system message is MassGen's coordination message with
    the agent's own prompt as one section; the span records that prompt apart."""
    system = (f'<system_prompt>\n<agent_identity priority="critical">\n{own}\n</agent_identity>'
              f'\n<massgen_coordination priority="critical">\nAnswer, or vote for the best '
              f'answer so far.\n</massgen_coordination>\n</system_prompt>')
    messages = [{"role": "system", "parts": [{"type": "text", "content": system}]},
                {"role": "user", "parts": [{"type": "text", "content": "What is 2+3?"}]}]
    answer = [{"role": "assistant", "parts": [{"type": "text", "content": "5"}]}]
    row = llm(episode, t, agent=agent, prompt=None, completion=None, trace=episode.ljust(32, "a"))
    row["attributes"] = json.dumps({sc.GEN_AI_INPUT_MESSAGES: json.dumps(messages),
                                    sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(answer),
                                    sc.PROMPT_TEXT: own})
    return row


def test_p0_of_a_massgen_agent_is_its_own_prompt_not_the_coordination_message(tmp_path):
    """MassGen-shaped spans: APO's root (kept as p0) and what its optimizer rewrites are the
    agent's own prompt, not MassGen's whole message; an agent with no prompt of its own gets
    none recorded and one proposed, not the coordination message."""
    own = "You are agent A: check the sum twice."
    rows = [massgen_call(e, 10 * k + j, agent, text) for k, e in enumerate(["e1", "e2"])
            for j, (agent, text) in enumerate([("agent_a", own), ("agent_b", "")])]
    (tmp_path / "spans").mkdir()
    pq.write_table(table(rows), tmp_path / "spans/spans.parquet")
    rewards = {"e1": 1.0, "e2": 0.0}
    reg = PromptRegistry(tmp_path / "reg")
    search = ApoSearchConfig(beam_width=1, branch_factor=1, beam_rounds=1)
    roots = {}
    for agent in ("agent_a", "agent_b"):
        pool = transcripts(tmp_path / "spans", rewards, max_chars=10_000, agent=agent)
        assert len(pool) == 2 and all("<massgen_coordination" in t.text for t in pool)
        optimizer = RecordingOptimizer()
        searched = search_agent(
            agent, pool, search=search, registry=reg, optimizer=optimizer,
            scoring=Scoring("unused", [{"task_id": "t1"}], "http://unused", None),
            work=tmp_path / "apo" / agent, rng=random.Random(0), others={}, source="test",
            log=lambda _: None, root_scores=Scores({"t1": 0.5}))
        roots[agent] = searched.root.text
        assert optimizer.prompts == [searched.root.text] * 2  # what a candidate would rewrite
    assert roots == {"agent_a": own, "agent_b": ""}
    assert reg.text("agent_a", "p0") == own  # kept as p0, the coordination message left out
    assert reg.text("agent_b", "p0") is None  # none of its own: nothing recorded
