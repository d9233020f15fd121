"""``algorithm = "apo"`` in ``agl-bridge loop`` (issue 33, item 3): each round searches the
solver's system prompt from the round's rewarded episodes, gates the best candidate on
held-out tasks with the loop's gate, publishes it to the registry's prompt table, which the
team follows on its next calls, and the watch rolls a prompt version back as it rolls back an
adapter version. The server is scripted and has no LoRA endpoints (none is needed: no model,
no training); the team is a real program under zero-code capture with the live prompt swap.
Each prompt's answers are scripted per number, so "better" and "worse" are deterministic."""

from __future__ import annotations

import json
import re
import sys

import pytest

from agl_bridge.settings import SettingError, build
from agl_bridge.trainer.loop.apo.optimizer import CRITIQUE_SYSTEM, REWRITE_SYSTEM
from agl_bridge.trainer.loop.apo.versions import episode_prompt_versions
from agl_bridge.trainer.loop.config import LoopConfig
from agl_bridge.trainer.loop.engine import Loop
from agl_bridge.trainer.loop.summary import summary_text
from agl_bridge.trainer.loop.team import write_tasks
from agl_bridge.trainer.serving.prompts import PromptRegistry
from tests.paths import AGENTS
from tests.scripted_server import ScriptedServer

TEAM = f"{sys.executable} {AGENTS / 'apo_team.py'}"
OWN = "You are a helpful assistant."  # the solver's own prompt (apo_team.py)
DIGITS = "Reply with the number you are asked to say, digits only."  # right on every number
SMALL = "Say small numbers in digits."  # right below 100 only
BRIEF = "Be brief."  # right up to 4 only
POLITE = "Be polite."  # never right


def right(system: str, number: int) -> bool:
    """Whether the solver, under this system prompt, says the number: the scripted model."""
    return {DIGITS: True, SMALL: number < 100, BRIEF: number <= 4, POLITE: False}.get(
        system, number % 2 == 1 or number >= 100)  # its own prompt: odd numbers, and big ones


class World:
    """The scripted server's answers: the team's by ``right``; the optimizer's critique, and
    its rewrites from a list."""

    def __init__(self, rewrites: list[str]) -> None:
        self.rewrites = list(rewrites)
        self.critiques: list[str] = []
        self.team: list[tuple[str, int]] = []  # (system prompt, number) of each team call

    def __call__(self, body):
        system = body["messages"][0]["content"]
        if system == CRITIQUE_SYSTEM:
            self.critiques.append(body["messages"][1]["content"])
            return "Say the number.", []
        if system == REWRITE_SYSTEM:
            return f"<prompt>{self.rewrites.pop(0) if self.rewrites else POLITE}</prompt>", []
        number = int(re.search(r"say (\d+)", body["messages"][-1]["content"]).group(1))
        self.team.append((system, number))
        return (str(number) if right(system, number) else "hello"), []


def setup(tmp_path, server, train: list[int], held_out: list[int] | None, **settings):
    write_tasks(tmp_path / "train.jsonl", [{"task_id": f"t{i}", "number": n}
                                           for i, n in enumerate(train)])
    values = dict(workdir=str(tmp_path / "loop"), server=server.base_url, algorithm="apo",
                  serve={"registry": str(tmp_path / "registry")}, agents=["solver"], team=TEAM,
                  tasks=str(tmp_path / "train.jsonl"), tasks_per_round=4, rollouts=2,
                  rounds=2, minutes=30, watch={"episodes": 8},
                  apo={"beam_width": 1, "branch_factor": 1, "beam_rounds": 1,
                       "val_batch_size": 4})
    if held_out is not None:
        write_tasks(tmp_path / "eval.jsonl", [{"task_id": f"e{i}", "number": n}
                                              for i, n in enumerate(held_out)])
        values["eval_tasks"] = str(tmp_path / "eval.jsonl")
    for key, value in settings.items():
        table, _, name = key.rpartition(".")
        (values.setdefault(table, {}) if table else values)[name] = value
    return build(LoopConfig, values, "test")


def round_versions(tmp_path, r: int) -> set[str]:
    """The prompt versions the round's episodes carried (from their chat spans)."""
    return set(episode_prompt_versions(tmp_path / f"loop/round{r:02d}/spans").values())


def read_as_text(monkeypatch) -> list:
    """The span file sets the loop reads as text (``text_traces``), one entry per reading."""
    from agl_bridge.trainer.loop.apo import transcripts

    made: list = []
    real = transcripts.text_traces
    monkeypatch.setattr(transcripts, "text_traces", lambda s: made.append(s) or real(s))
    return made


def test_a_candidate_is_published_and_the_team_follows_it(tmp_path, monkeypatch):
    made = read_as_text(monkeypatch)
    world = World([DIGITS, BRIEF])
    with ScriptedServer(vllm=True, script=world) as server:  # no LoRA endpoints: none needed
        data = Loop(setup(tmp_path, server, train=[2, 4, 6, 8, 10, 12, 14, 16],
                          held_out=[50, 52, 54, 56])).run()
    r0, r1 = data["rounds"]
    # round 0: the round's own episodes scored the root (0: even numbers); DIGITS won on the
    # round's tasks, passed the gate on the held-out ones, and was published
    assert r0["lever"] == "apo" and r0["apo"]["solver"]["root"] == "solver@p0"
    assert r0["apo"]["solver"]["root_score"] == 0.0 and r0["apo"]["solver"]["best_score"] == 1.0
    assert r0["gate"]["publish"] and r0["gate"]["difference"] == 1.0
    assert r0["published"] == {"solver": "solver@p1"}
    reg = PromptRegistry(tmp_path / "registry")
    assert reg.text("solver", "p1") == DIGITS and reg.text("solver", "p0") == OWN
    assert json.loads((tmp_path / "registry/prompts.json").read_text())["prompts"] == {
        "solver": {"version": "solver@p1", "text": DIGITS}}
    # round 1: the team's next calls had the published version; the watch kept it
    assert round_versions(tmp_path, 0) == {"solver@p0"}
    assert round_versions(tmp_path, 1) == {"solver@p1"}
    assert {s for s, n in world.team if n in (10, 12, 14, 16)} >= {DIGITS}
    assert r1["prompt_watch"]["verdict"] == "keep" and r1["prompt_watch"]["current"] == 1.0
    assert r1["published"] == {}  # BRIEF did not beat p1 on round 1's tasks (nothing new)
    assert data["baseline"]["score"] == 0.0 and data["final"]["score"] == 1.0
    events = [e["event"] for e in data["events"]]
    assert events == ["prompt published"] and data["live"] == {"solver": "base"}
    # the optimizer never saw a held-out task; every candidate is kept with its diff
    assert world.critiques and not any(f"say {n}" in c for c in world.critiques
                                       for n in (50, 52, 54, 56))
    rows = [json.loads(line) for line in (tmp_path / "loop/round00/apo/solver/candidates.jsonl")
            .read_text().splitlines()]
    assert [r["text"] for r in rows] == [OWN, DIGITS] and f"+{DIGITS}" in rows[1]["diff"]
    text = summary_text(data)  # the loop's summary.txt
    assert "round 0: APO, 1 prompt candidate(s); published solver@p1" in text
    assert "round 1: APO, 1 prompt candidate(s); no candidate beat the live prompts" in text
    # the episodes each prompt version served: the watch's record, in the summary
    assert "  solver@p0: 8 episodes, 0.000 [0.000, 0.324]; replaced" in text.splitlines()
    assert "  solver@p1: 8 episodes, 1.000 [0.676, 1.000]; live" in text.splitlines()
    # each round read its spans once: the watch and the search shared one reading
    assert made == [[tmp_path / f"loop/round{r:02d}/spans"] for r in (0, 1)]


@pytest.mark.parametrize("vllm", [True, False], ids=["vllm", "hosted-api-no-token-ids"])
def test_the_gate_refuses_a_candidate_worse_on_held_out_tasks(tmp_path, vllm):
    """SMALL is right on every training number (below 100) and wrong on every held-out one
    (100 and more), where the solver's own prompt is right: refused, never live. A server
    that is not vLLM returns no token ids, so conversion gives no rewards: the round's episodes
    are rewarded by the team's own result lines."""
    world = World([SMALL])
    with ScriptedServer(vllm=vllm, script=world) as server:
        data = Loop(setup(tmp_path, server, train=[2, 4, 6, 8], held_out=[100, 102, 104, 106],
                          rounds=1)).run()
    (r0,) = data["rounds"]
    assert r0["apo"]["solver"]["best_score"] == 1.0 > r0["apo"]["solver"]["root_score"]
    assert r0["gate"]["publish"] is False and r0["gate"]["difference"] == -1.0
    assert r0["candidate"] == {"solver": "solver@p1"} and "published" not in r0
    assert [e["event"] for e in data["events"]] == ["prompt refused"]
    assert "95% interval" in data["events"][0]["reason"]
    assert PromptRegistry(tmp_path / "registry").read_live() == {}  # the table stayed empty
    # the gate played the candidate on the held-out tasks, through its own table
    assert {n for s, n in world.team if s == SMALL} >= {100, 102, 104, 106}
    assert data["final"]["score"] == 1.0  # the own prompt, still live


def test_the_watch_rolls_back_a_prompt_version_whose_reward_dropped(tmp_path):
    """BRIEF wins round 0 (numbers 1-4) and goes live (gate off); on round 1's numbers (5-8)
    it is never right where the own prompt was right half the time: rolled back to p0, and
    round 2's calls have the solver's own prompt again."""
    world = World([BRIEF, POLITE])
    with ScriptedServer(vllm=True, script=world) as server:
        data = Loop(setup(tmp_path, server, train=[1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 15],
                          held_out=None, rounds=3, **{"gate.rule": "off"})).run()
    r0, r1, r2 = data["rounds"]
    assert r0["published"] == {"solver": "solver@p1"} and r0["gate"]["rule"] == "gate off"
    assert r2["lever"] == "apo" and r2["apo"]["solver"]["root"] == "solver@p0"
    assert r1["prompt_watch"]["verdict"] == "rollback" and r1["prompt_rolled_back"] is True
    assert r1["prompt_watch"]["previous"] == 0.5 and r1["prompt_watch"]["current"] == 0.0
    assert r1["prompt_watch"]["against"] == {"solver": "solver@p0"}
    back = [e for e in data["events"] if e["event"] == "prompt rolled back"]
    assert back[0]["from"] == {"solver": "solver@p1"} and back[0]["to"] == {"solver": "solver@p0"}
    assert "published" not in r1 or r1["published"] == {}  # no search right after a rollback
    assert json.loads((tmp_path / "registry/prompts.json").read_text())["prompts"] == {
        "solver": {"version": "solver@p0"}}
    assert round_versions(tmp_path, 1) == {"solver@p1"}
    assert round_versions(tmp_path, 2) == {"solver@p0"}  # the team's own prompt again
    assert [s for s, n in world.team if n in (9, 11, 13, 15)][:8] == [OWN] * 8
    history = {v.name: v.state for v in PromptRegistry(tmp_path / "registry")
               .read_history()["solver"]}
    assert history == {"solver@p0": "live", "solver@p1": "retired"}
    assert "; prompts rolled back: live reward 0.000 over 8 episodes" in summary_text(data)


def test_an_optimizer_that_cannot_be_reached_skips_the_agent(tmp_path):
    """The loop goes on: the round records why, nothing is published, the team is unchanged."""
    world = World([DIGITS])
    with ScriptedServer(vllm=True, script=world) as server:
        data = Loop(setup(tmp_path, server, train=[2, 4, 6, 8], held_out=None, rounds=1,
                          **{"gate.rule": "off",
                             "apo.optimizer_base_url": "http://127.0.0.1:9/v1"})).run()
    (r0,) = data["rounds"]
    assert "cannot reach http://127.0.0.1:9/v1" in r0["apo"]["solver"]["failed"]
    assert r0["published"] == {} and data["events"] == []
    assert world.rewrites == [DIGITS] and not world.critiques  # never asked


def test_apo_settings(tmp_path):
    base = dict(workdir=str(tmp_path / "w"), server="http://127.0.0.1:9/v1", agents=["solver"],
                team="python t.py", tasks="t.jsonl", gate={"rule": "off"})
    with pytest.raises(SettingError, match=r"loop\.toml: algorithm = 'ppo': expected one "
                                          r"of 'lora', 'apo', 'apo\+lora'"):
        build(LoopConfig, {**base, "algorithm": "ppo"}, "loop.toml")
    with pytest.raises(SettingError, match=r"apo\.beam_width"):
        build(LoopConfig, {**base, "algorithm": "apo", "apo": {"beam_width": "wide"}}, "t")
    with pytest.raises(SettingError, match=r"apo\.temperature"):  # the batch job's, not here
        build(LoopConfig, {**base, "algorithm": "apo", "apo": {"temperature": 1.0}}, "t")
    # apo needs no model (no training, no LoRA serving); lora and apo+lora do
    assert build(LoopConfig, {**base, "algorithm": "apo"}, "t").check().model == ""
    for algorithm in ("lora", "apo+lora"):
        with pytest.raises(ValueError, match="model: a local model directory is required"):
            build(LoopConfig, {**base, "algorithm": algorithm}, "t").check()
    live = {k: v for k, v in base.items() if k not in ("team", "tasks")}
    with pytest.raises(ValueError, match="algorithm apo on live traces: prompt candidates play "
                                         "the round's newest real inputs again: give "
                                         "replay_team"):
        build(LoopConfig, {**live, "traces": str(tmp_path), "algorithm": "apo"}, "t").check()
    live_apo = {**live, "traces": str(tmp_path), "algorithm": "apo", "replay_team": "python r"}
    assert build(LoopConfig, live_apo, "t").check().traces == str(tmp_path)
    inputs = build(LoopConfig, {**live_apo, "gate": {"rule": "not_worse", "inputs": 4}}, "t")
    assert inputs.check().gate.inputs == 4  # the prompt gate on real inputs replayed
    with pytest.raises(ValueError, match=r"gate\.inputs replays real inputs of a live traces"):
        build(LoopConfig, {**base, "algorithm": "apo", "gate": {"inputs": 4}}, "t").check()


@pytest.mark.parametrize("token_ids", [True, False], ids=["vllm", "hosted-api"])
def test_apo_on_a_live_service(tmp_path, token_ids, monkeypatch):
    """Live traces (``traces``, no team of the loop's): a service, the same program, answers users
    with the registry's prompt table, on vLLM or on a hosted API that sends no token ids (the loop
    counts the users' rewarded episodes from their text). Each round's search reads the users'
    rewarded episodes since the last round; candidates (and the root) play the round's newest real
    inputs again through the replay command; the winner is gated on the held-out tasks and
    published; the service's next calls carry it, and the watch judges it by the users' rewards."""
    from agl_bridge.trainer.loop.engine import LoopCallback
    from agl_bridge.trainer.loop.team import run_team

    made = read_as_text(monkeypatch)
    world = World([DIGITS, POLITE])
    prod = tmp_path / "prod"

    def service(n: int, numbers: list[int]) -> None:
        run_team(TEAM, [{"task_id": f"u{n}-{i}", "number": x} for i, x in enumerate(numbers)],
                 prod / f"run{n}", base_url=server.base_url, aliases=None,
                 extra_env={"AGL_BRIDGE_PROMPTS": str(tmp_path / "registry/prompts.json"),
                            "AGL_BRIDGE_CAPTURE": "messages"})

    class Users(LoopCallback):  # more users after each round, on what is live then
        def on_round_end(self, loop, directory, record):
            service(record["round"] + 1, [14, 16, 18, 20, 22, 24])

    with ScriptedServer(vllm=token_ids, script=world) as server:
        service(0, [2, 4, 6, 8, 10, 12])  # its own prompt: wrong on even numbers
        cfg = setup(tmp_path, server, train=[], held_out=[50, 52, 54, 56], team=None,
                    tasks=None, traces=str(prod), settle_s=0.0, min_episodes=6, max_wait_s=5.0,
                    replay_team=TEAM, replay_field="app.number", eval_team=TEAM,
                    **{"watch.episodes": 6})
        data = Loop(cfg, callbacks=[Users()]).run()
    r0, r1 = data["rounds"]
    # round 0: the users' episodes were critiqued; the root and DIGITS played the newest four
    # real inputs again; DIGITS won, passed the gate on the held-out tasks, was published
    assert r0["apo"]["solver"]["root"] == "solver@p0"
    assert r0["apo"]["solver"]["root_score"] == 0.0 and r0["apo"]["solver"]["best_score"] == 1.0
    assert {n for s, n in world.team if s == DIGITS} >= {6, 8, 10, 12}
    users = {int(n) for n in re.findall(r"user: say (\d+)", world.critiques[0])}
    assert users and users <= {2, 4, 6, 8, 10, 12} and "reward 0" in world.critiques[0]
    assert r0["gate"]["publish"] and r0["published"] == {"solver": "solver@p1"}
    # the service followed the table: its next users got p1, and the watch kept it by their
    # rewards (1.0 against p0's 0.0)
    assert set(episode_prompt_versions(prod / "run0/spans").values()) == {"solver@p0"}
    assert set(episode_prompt_versions(prod / "run1/spans").values()) == {"solver@p1"}
    assert r1["prompt_watch"]["verdict"] == "keep" and r1["prompt_watch"]["current"] == 1.0
    assert r1["published"] == {}  # POLITE did not beat p1 on round 1's inputs
    assert data["baseline"]["score"] == 0.0 and data["final"]["score"] == 1.0
    assert not any(f"say {n}" in c for c in world.critiques for n in (50, 52, 54, 56))
    # each round read the users' new span files once: the wait for rewarded episodes, the
    # watch and the search shared one reading
    assert [sorted(map(str, s)) for s in made] == [sorted(r["consumed"]) for r in (r0, r1)]
    if token_ids:  # conversion groups the users' episodes by prompt version (a key baseline)
        _groups_by_prompt_version([prod / "run0/spans", prod / "run1/spans"], tmp_path)


@pytest.mark.parametrize("users, published, replay_k", [
    ([2, 4, 6, 8, 30, 32], {"solver": "solver@p1"}, 0),
    ([2, 4, 6, 8, 150, 152], {}, 0),
    ([2, 4, 6, 8, 150, 152], {}, 2),
], ids=["better-on-the-newest-inputs", "worse-on-the-newest-inputs", "and-replayed-for-groups"])
def test_the_prompt_gate_on_real_inputs_replayed(tmp_path, users, published, replay_k):
    """``[gate] inputs = 2`` on a live service with no held-out tasks: the live prompts and the
    candidate each play the round's two newest real inputs again (the replay command), which
    the search and its critiques never see; candidates play the four before them. SMALL (right
    below 100 only) beats the service's own prompt (wrong on even numbers below 100, right on
    big ones) on 2..8 either way: on 30 and 32 it passes the gate and is published, on 150 and
    152 it is worse and refused. With ``replay_k`` the loop's own replays of the gate's inputs
    (rewarded 1: its own prompt is right on big numbers) are kept from the critiques too."""
    from agl_bridge.trainer.loop.team import read_results, run_team

    world = World([SMALL])
    prod = tmp_path / "prod"
    with ScriptedServer(vllm=True, script=world) as server:
        run_team(TEAM, [{"task_id": f"u{i}", "number": x} for i, x in enumerate(users)],
                 prod / "run0", base_url=server.base_url, aliases=None,
                 extra_env={"AGL_BRIDGE_PROMPTS": str(tmp_path / "registry/prompts.json"),
                            "AGL_BRIDGE_CAPTURE": "messages"})
        cfg = setup(tmp_path, server, train=[], held_out=None, team=None, tasks=None,
                    traces=str(prod), settle_s=0.0, min_episodes=6, max_wait_s=5.0,
                    replay_team=TEAM, replay_field="app.number", rounds=1, replay_k=replay_k,
                    **{"gate.inputs": 2})
        data = Loop(cfg).run()
    (r0,) = data["rounds"]
    newest = users[4:]
    # the search: the root and SMALL on the four inputs before the gate's
    assert r0["apo"]["solver"]["root_score"] == 0.0 and r0["apo"]["solver"]["best_score"] == 1.0
    assert {n for s, n in world.team if s == SMALL} == set(users)  # the gate's two too
    assert world.critiques and not any(f"say {n}" in c for c in world.critiques for n in newest)
    # the gate: live and candidate prompts each on the two newest inputs, replayed
    for label in ("live", "candidate"):
        rows = read_results(tmp_path / f"loop/round00/gate-{label}/results.jsonl")
        assert sorted(r["task_id"] for r in rows) == ["replay:u4"] * 2 + ["replay:u5"] * 2
    assert {n for s, n in world.team if s == OWN} >= set(newest)
    assert r0["gate"]["n"] == 2 and r0["gate"]["publish"] == bool(published)
    assert r0["gate"]["difference"] == (1.0 if published else -1.0)
    assert r0.get("published", {}) == published
    table = json.loads((tmp_path / "registry/prompts.json").read_text())["prompts"]
    assert table == ({"solver": {"version": "solver@p1", "text": SMALL}} if published else {})
    events = [e["event"] for e in data["events"]]
    assert events == ["prompt published" if published else "prompt refused"]


def _groups_by_prompt_version(spans, tmp_path):
    import pyarrow.parquet as pq

    from agl_bridge import semconv as sc
    from agl_bridge.trainer.conversion import ConvertConfig, convert

    out = tmp_path / "by-version.parquet"
    convert([str(s) for s in spans], out, ConvertConfig(baseline=f"key:{sc.PROMPT_VERSION}"))
    version = {e: v for s in spans for e, v in episode_prompt_versions(s).items()}
    groups: dict[str, set[str]] = {}
    for row in pq.read_table(out, columns=["episode_id", "group_id"]).to_pylist():
        groups.setdefault(row["group_id"], set()).add(version[row["episode_id"]])
    assert len(groups) == 2 and all(len(v) == 1 for v in groups.values())
    assert set().union(*groups.values()) == {"solver@p0", "solver@p1"}


def test_apo_and_lora_take_turns(tmp_path):
    cfg = build(LoopConfig, dict(workdir=str(tmp_path / "w"), model=str(tmp_path),
                                 server="http://127.0.0.1:9/v1", agents=["solver"],
                                 team="python t.py", tasks="t.jsonl", gate={"rule": "off"},
                                 algorithm="apo+lora"), "t")
    loop = Loop(cfg)
    try:
        assert loop.prompts is not None
        assert [loop.prompts.turn(r) for r in range(4)] == [True, False, True, False]
    finally:
        loop.release()
    plain = Loop(build(LoopConfig, {**cfg.settings(), "algorithm": "lora",
                                    "workdir": str(tmp_path / "w2")}, "t"))
    plain.release()
    assert plain.prompts is None  # the prompt table is left alone


RIGHT_SUM = "Answer with the right sum."


def arith_world(requests: list[dict]):
    """The demo's AutoGen team on a scripted model: the solver gets the sum right only under a
    system prompt that asks for the right sum (its own has none), the checker restates the
    solver's line; the optimizer proposes that prompt for the solver and a harmless one for
    the checker."""
    def script(body):
        requests.append(body)
        msgs = body["messages"]
        if msgs[0]["content"] in (CRITIQUE_SYSTEM, REWRITE_SYSTEM):
            if msgs[0]["content"] == CRITIQUE_SYSTEM:
                return "Give the sum.", []
            return ("<prompt>" + (RIGHT_SUM if "`solver`" in msgs[1]["content"] else
                                  "Restate the solver's line.") + "</prompt>"), []
        question = next(m["content"] for m in msgs if "Compute" in str(m["content"]))
        a, b = map(int, re.search(r"Compute (\d+) \+ (\d+)", question).groups())
        if "Compute" not in str(msgs[-1]["content"]):  # the checker: the solver's line again
            return str(msgs[-1]["content"]), []
        system = msgs[0]["content"] if msgs[0]["role"] == "system" else ""
        return f"{a} + {b} = {a + b + (0 if RIGHT_SUM in system else 1)}", []
    return script


def test_demo_apo_publishes_a_prompt_the_team_then_uses(tmp_path, monkeypatch, capsys):
    """``agl-bridge demo --apo``: the arithmetic team (AutoGen, zero-code capture) on the base
    model only; the round's APO finds the solver a prompt, the gate passes it, and the final
    held-out evaluation is answered through it. vLLM is stood in for by the scripted server."""
    from types import SimpleNamespace

    from agl_bridge.trainer.loop import demo, engine

    requests: list[dict] = []
    with ScriptedServer(vllm=True, script=arith_world(requests)) as server:
        monkeypatch.setattr(engine, "start_vllm", lambda cfg: SimpleNamespace(
            base_url=server.base_url, stop=lambda: None))
        (tmp_path / "model").mkdir()
        data = demo.main(["--apo", "--workdir", str(tmp_path / "demo"), "--model",
                          str(tmp_path / "model"), "--task", "add", "--rounds", "1",
                          "--tasks-per-round", "4", "--rollouts", "2", "--eval-size", "4",
                          "--gate-size", "4", "--apo.beam-width", "1",
                          "--apo.branch-factor", "1", "--apo.val-batch-size", "4"])
    (r0,) = data["rounds"]
    assert data["settings"]["algorithm"] == "apo"
    assert r0["apo"]["solver"]["root"] == "solver@p0" and r0["published"] == {
        "solver": "solver@p1"}  # the checker's rewrite tied with its own prompt: kept
    assert r0["apo"]["checker"]["best"] == "root" and "adapters" not in r0
    assert data["baseline"]["success"]["rate"] == 0.0 and data["final"]["success"]["rate"] == 1.0
    assert set(episode_prompt_versions(tmp_path / "demo/final/spans").values()) == {
        "checker@p0,solver@p1"}
    solver_calls = [b for b in requests if b["messages"][-1]["content"].startswith("Compute")]
    assert solver_calls[-1]["messages"][0] == {"role": "system", "content": RIGHT_SUM}
    assert not any("lora" in str(b.get("model")) for b in requests)
    assert "APO, 2 prompt candidate(s) -> solver@p1" in capsys.readouterr().out
    page = (tmp_path / "demo/report.html").read_text()
    assert "algorithm apo" in page and "APO: 2 prompt candidate(s)" in page


def test_apo_and_lora_in_turn_on_one_team(tmp_path, tiny):
    """``algorithm = "apo+lora"``: round 0 publishes a prompt version, round 1 (after the
    watch kept it) trains an adapter from episodes played under it and gates it under it too;
    the team ends on both. A tiny model trains; the scripted server has vLLM's LoRA endpoints
    and answers by the system prompt alone."""
    requests: list[dict] = []

    def script(body):
        requests.append(body)
        system = body["messages"][0]["content"]
        if system == CRITIQUE_SYSTEM:
            return "Say the number.", []
        if system == REWRITE_SYSTEM:
            return f"<prompt>{DIGITS}</prompt>", []
        match = re.search(r"say (\d+)", body["messages"][-1]["content"])
        if match is None:  # the publisher's probe of a loaded adapter
            return "ok", []
        return (match.group(1) if system == DIGITS else "hello"), []

    team = f"{sys.executable} {AGENTS / 'loop_team.py'}"  # asks for the alias, no system prompt
    with ScriptedServer(vllm=True, lora=True, base_model="base", script=script,
                        completion_ids=[11, 12]) as server:
        cfg = setup(tmp_path, server, train=list(range(2, 10)), held_out=[50, 52, 54, 56],
                    algorithm="apo+lora", model=str(tiny), team=team,
                    **{"train.learning_rate": 1e-2, "train.per_device_train_batch_size": 4,
                       "train.lora_r": 4, "train.lora_alpha": 8,
                       "train.policy": "per_agent_lora"})
        data = Loop(cfg).run()
    r0, r1 = data["rounds"]
    assert r0["lever"] == "apo" and r0["published"] == {"solver": "solver@p1"}
    assert "adapters" not in r0  # nothing trained in a prompt round
    assert r1["lever"] == "lora" and r1["prompt_watch"]["verdict"] == "keep"
    assert r1["published"] == {"solver": "solver@v1"} and r1["gate"]["difference"] == 0.0
    # the adapter was gated, and the team ends, under the published prompt
    v1 = [b for b in requests if b["model"] == "solver@v1"
          and b["messages"][-1]["content"].startswith("say")]  # not the publisher's probe
    assert v1 and {b["messages"][0]["content"] for b in v1} == {DIGITS}
    assert data["live"] == {"solver": "solver@v1"} and data["final"]["score"] == 1.0
    assert PromptRegistry(tmp_path / "registry").read_live() == {"solver": "solver@p1"}
    assert any(" prompts solver@p1#" in key for key in data["evals"])


@pytest.mark.parametrize("partial", [False, True], ids=["whole", "partial"])
def test_a_partial_prompt_gate_publishes_the_agent_that_passed(tmp_path, partial):
    """Two agents; the team's score is the mean of their own. On the round's numbers (even,
    below 100) DIGITS beats the solver's own prompt and then SMALL the checker's; on the
    held-out ones (100 and more) the solver's DIGITS holds and the checker's SMALL is worse
    than its own: the team loses 0.5, within ``[gate] tolerance`` (0.5), the checker 1.0,
    beyond it. Refused whole, or under ``[gate] partial`` the solver's version goes live
    alone."""
    world = World([DIGITS, SMALL])
    with ScriptedServer(vllm=True, script=world) as server:
        data = Loop(setup(tmp_path, server, train=[2, 4, 6, 8], held_out=[100, 102, 104, 106],
                          rounds=1, agents=["solver", "checker"],
                          team=f"env APO_TEAM_CHECKER=1 {TEAM}",
                          **{"gate.partial": partial, "gate.tolerance": 0.5})).run()
    (r0,) = data["rounds"]
    assert r0["candidate"] == {"solver": "solver@p1", "checker": "checker@p1"}
    assert r0["gate"]["team_publish"] is True and r0["gate"]["difference"] == -0.5
    assert r0["gate"]["roles"]["checker"]["difference"] == -1.0
    assert r0["gate"]["roles"]["solver"]["difference"] == 0.0
    assert r0["gate"]["publish"] is partial and "role checker worse" in r0["gate"]["rule"]
    assert r0.get("published", {}) == ({"solver": "solver@p1"} if partial else {})
    assert r0["gate"].get("partial") == (["solver"] if partial else None)
    refused = [e for e in data["events"] if e["event"] == "prompt refused"]
    assert [e["candidate"] for e in refused] == (
        [{"checker": "checker@p1"}] if partial else
        [{"solver": "solver@p1", "checker": "checker@p1"}])
    assert PromptRegistry(tmp_path / "registry").read_live() == (
        {"solver": "solver@p1"} if partial else {})
