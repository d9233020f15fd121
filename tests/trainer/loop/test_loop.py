"""``agl-bridge loop`` on real training (a tiny model) with a scripted server in vLLM's place:
the gate refuses a worse candidate, the watch rolls back a version whose live reward dropped,
and a loop killed mid-run goes on from its state file. The scripted server makes "worse"
deterministic: it answers wrongly for the adapter versions a test names."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agl_bridge.settings import SettingError, build
from agl_bridge.trainer.loop.config import LoopConfig
from agl_bridge.trainer.loop.engine import Loop, LoopCallback
from agl_bridge.trainer.loop.gate import Scores, decide, gate, paired
from agl_bridge.trainer.loop.team import role_scores, write_tasks
from agl_bridge.trainer.loop.watch import watch
from tests.loop_server import server_for
from tests.paths import AGENTS

TEAM = f"python {AGENTS / 'loop_team.py'}"


def setup(tmp_path, tiny, server, **settings):
    write_tasks(tmp_path / "train.jsonl", [{"task_id": f"t{i}", "number": i} for i in range(12)])
    write_tasks(tmp_path / "eval.jsonl", [{"task_id": f"e{i}", "number": 100 + i}
                                          for i in range(6)])
    values = dict(workdir=str(tmp_path / "loop"), model=str(tiny), server=server.base_url,
                  serve={"registry": str(tmp_path / "registry")}, agents=["solver"], team=TEAM,
                  tasks=str(tmp_path / "train.jsonl"), tasks_per_round=4, rollouts=2,
                  eval_tasks=str(tmp_path / "eval.jsonl"), rounds=2, minutes=30,
                  train={"learning_rate": 1e-2, "per_device_train_batch_size": 4, "lora_r": 4,
                         "lora_alpha": 8, "policy": "per_agent_lora"},
                  watch={"episodes": 4}, convert={"missing_reward": "drop"})
    for key, value in settings.items():
        table, _, name = key.rpartition(".")
        (values.setdefault(table, {}) if table else values)[name] = value
    return build(LoopConfig, values, "test")


class Recorder(LoopCallback):
    """The loop's public callbacks, in the order they come."""

    def __init__(self):
        self.calls = []

    def on_train_begin(self, loop):
        self.calls.append("train_begin")

    def on_train_end(self, loop):
        self.calls.append("train_end")

    def on_evaluate(self, loop, label, out):
        self.calls.append(f"evaluate {label} {(out / 'results.jsonl').exists()}")
        loop.data[label]["seen_by_callback"] = True  # saved with the state

    def on_round_end(self, loop, directory, record):
        self.calls.append(f"round_end {record['round']} {directory.name}")


def test_the_gate_refuses_a_worse_candidate_and_publishes_a_good_one(tmp_path, tiny):
    recorder = Recorder()
    with server_for(bad={"solver@v1"}) as server:
        data = Loop(setup(tmp_path, tiny, server), callbacks=[recorder]).run()
    assert recorder.calls == ["evaluate baseline True", "train_begin", "train_end",
                              "round_end 0 round00", "train_begin", "train_end",
                              "round_end 1 round01", "evaluate final True"]
    saved = json.loads((tmp_path / "loop" / "state.json").read_text())
    assert saved["baseline"]["seen_by_callback"] and saved["final"]["seen_by_callback"]
    r0, r1 = data["rounds"]
    assert r0["gate"]["publish"] is False and r0["gate"]["difference"] == -1.0
    assert "refused" not in r0 and r0.get("published") is None
    assert r0["live_after"] == {"solver": "base"}  # the worse adapter never went live
    assert r1["gate"]["publish"] is True and r1["published"] == {"solver": "solver@v2"}
    assert data["live"] == {"solver": "solver@v2"}
    assert json.loads((tmp_path / "registry" / "aliases.json").read_text())["aliases"] == {
        "solver": "solver@v2"}
    assert "solver@v1" not in server.adapters  # the refused candidate was unloaded
    refused = [e for e in data["events"] if e["event"] == "refused"]
    assert len(refused) == 1 and "95% interval" in refused[0]["reason"]
    assert data["final"]["score"] == 1.0 and data["baseline"]["score"] == 1.0


def test_a_shared_policy_is_published_to_every_agent_and_trained_on(tmp_path, tiny):
    """policy="shared" trains one adapter (``policy``): each agent serves it under its own
    alias, and the next round continues it (it was published to no agent, and the team stayed
    on the base model)."""
    with server_for(bad=set()) as server:
        data = Loop(setup(tmp_path, tiny, server, **{"train.policy": "shared"})).run()
    r0, r1 = data["rounds"]
    assert r0["adapters"] == {"policy": str(tmp_path / "loop" / "adapters" / "policy" / "v0001")}
    assert r0["published"] == {"solver": "solver@v1"}
    assert r1["published"] == {"solver": "solver@v2"} and data["live"] == {"solver": "solver@v2"}
    assert (tmp_path / "loop" / "adapters" / "policy" / "v0002").is_dir()
    assert "solver@v2" in server.adapters


def test_the_watch_rolls_back_a_version_whose_live_reward_dropped(tmp_path, tiny):
    # the gate is off; v1 goes live, then answers wrongly in the rollouts it serves
    with server_for(bad={"solver@v1"}) as server:
        data = Loop(setup(tmp_path, tiny, server, eval_tasks=None, **{"gate.rule": "off"})).run()
    r0, r1 = data["rounds"]
    assert r0["published"] == {"solver": "solver@v1"}
    assert r1["watch"]["verdict"] == "rollback" and r1["rolled_back"] is True
    assert r1["watch"]["current"] == 0.0 and r1["watch"]["previous"] == 1.0
    back = [e for e in data["events"] if e["event"] == "rolled back"]
    assert back and back[0]["to"] == {"solver": "base"}
    # round 1 then trained from base and published v2, which the server answers rightly
    assert r1["published"] == {"solver": "solver@v2"} and data["live"] == {"solver": "solver@v2"}


def test_nothing_is_published_until_the_watch_has_judged_the_live_version(tmp_path, tiny):
    """Issue 30: in the production demo v2 replaced v1 when the watch had seen 32 of the 64
    episodes it waits for, and v1's users had done worse. One change at a time: a round whose
    live version is not judged yet trains and publishes nothing; its episodes are kept, trained
    on in the next round, and counted once by the watch."""
    with server_for(bad={"solver@v1"}) as server:
        data = Loop(setup(tmp_path, tiny, server, eval_tasks=None, rounds=3,
                          **{"gate.rule": "off", "watch.episodes": 12})).run()
    r0, r1, r2 = data["rounds"]
    assert r0["published"] == {"solver": "solver@v1"}
    assert "8 of 12 episodes" in r1["held"] and r1["watch"]["verdict"] == "wait"
    assert "trained" not in r1 and "published" not in r1 and r1["live_after"] == r0["live_after"]
    assert r2["watch"]["verdict"] == "rollback" and r2["watch"]["n_current"] == 16
    assert r2["transitions"] == 2 * r0["transitions"]  # round 1's episodes trained on too
    assert len(data["rewards"]["solver@v1"]) == 16  # each episode once, though read twice
    assert r2["published"] == {"solver": "solver@v2"} and data["live"] == {"solver": "solver@v2"}
    assert "held_sources" not in data


def test_a_killed_loop_goes_on_from_its_state(tmp_path, tiny):
    with server_for(bad=set()) as server:
        cfg = setup(tmp_path, tiny, server, rounds=3, **{"gate.rule": "off"})
        config = tmp_path / "loop.json"
        config.write_text(json.dumps({k: v for k, v in cfg.settings().items()}))
        state = tmp_path / "loop" / "state.json"
        cmd = [sys.executable, "-m", "agl_bridge.cli", "loop", "--config", str(config)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:  # wait until round 0 is recorded
                if state.exists() and len(json.loads(state.read_text())["rounds"]) >= 1:
                    break
                time.sleep(0.2)
            else:
                pytest.fail("round 0 never finished")
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        round0 = json.loads(state.read_text())["rounds"][0]
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    data = json.loads(state.read_text())
    assert data["resumed"] == 1 and len(data["rounds"]) == 3
    assert data["rounds"][0] == round0  # kept as it was
    assert [r["published"] for r in data["rounds"]] == [
        {"solver": f"solver@v{n}"} for n in (1, 2, 3)]
    assert "round 2" in again.stdout and "held-out score" in again.stdout


def test_live_replay_turns_new_episodes_into_groups(tmp_path, tiny):
    """Production episodes never repeat; the loop plays the newest inputs again K times
    (their recorded ``app.number``) so each becomes a group, beside the live singles."""
    from agl_bridge.aliases import AliasTable
    from agl_bridge.trainer.loop.team import run_team

    with server_for(bad=set()) as server:
        aliases = AliasTable(tmp_path / "prod-aliases.json")
        aliases.write({"solver": "base"})
        run_team(TEAM, [{"task_id": f"p{i}", "number": i} for i in range(6)],
                 tmp_path / "prod", base_url=server.base_url, aliases=aliases.path)
        # issue 30.7: odd files in the live directory are skipped, not fatal to the round
        os.mkfifo(tmp_path / "prod" / "spans" / "odd.parquet")
        pq.write_table(pa.table({"x": [1]}), tmp_path / "prod" / "spans" / "other.parquet")
        server.requests.clear()
        cfg = setup(tmp_path, tiny, server, team=None, tasks=None,
                    traces=str(tmp_path / "prod" / "spans"), settle_s=0.0, min_episodes=6,
                    max_wait_s=5.0, rounds=1, eval_tasks=None, replay_k=3, replay_inputs=4,
                    replay_team=TEAM, replay_field="app.number",
                    **{"gate.rule": "off", "convert.baseline": "group,batch"})
        data = Loop(cfg).run()
        asked = [b["messages"][-1]["content"] for b in server.requests
                 if b.get("messages") and b["messages"][-1]["content"].startswith("say")]
    (r0,) = data["rounds"]
    assert r0["replay"]["inputs"] == 4 and r0["replay"]["k"] == 3
    # the four newest inputs, three times each, against the live (base) version
    assert sorted(asked) == sorted(f"say {n}" for n in (2, 3, 4, 5) for _ in range(3))
    # 12 replayed transitions in groups of 3, the 6 live singles against the batch
    assert r0["baselines"] == {"group": 12, "batch": 6} and r0["transitions"] == 18
    assert r0["published"] == {"solver": "solver@v1"}


@pytest.mark.parametrize("settings, problem", [
    ({"replay_k": 4}, "replay plays the inputs of a live traces directory"),
    ({"team": None, "tasks": None, "traces": "live", "replay_k": 1},
     "replay_k must be at least 2"),
    ({"team": None, "tasks": None, "traces": "live", "replay_k": 4, "replay_inputs": 0},
     "replay_inputs must be at least 1"),
    ({"team": None, "tasks": None, "traces": "live", "replay_k": 4},
     "replay needs a team command"),
])
def test_replay_settings_are_checked(settings, problem):
    _refused(settings, problem)


@pytest.mark.parametrize("settings, problem", [
    ({"convert.algorithm": "reinforce"}, "convert.algorithm = 'reinforce': expected one of "
                                         "'at_grpo', 'lightning_rl', 'ppo'"),
    ({"train.policy": "solo"}, "train.policy = 'solo': expected one of 'shared', "
                               "'per_agent_lora', 'per_agent_model'"),
    ({"train.train_agents": ["b"]}, r"train.train_agents \['b'\] must be among agents \['a'\]"),
    ({"train.objective": "sft", "train.sft_select": "top"}, "train.sft_select = 'top': "
                                                           "expected one of 'best', 'threshold'"),
    ({"train.objective": "sft", "train.sft_select": "threshold"}, "needs sft_min_reward"),
    ({"train.lora_r": 0}, "lora_r must be at least 1, got 0"),
    ({"convert.missing_reward": "abc"}, "convert.missing_reward = 'abc': expected one of "
                                        "'drop' or a number"),
    ({"train.learning_rate": "fast"}, "train.learning_rate = 'fast': expected a number"),
    ({"train.learnin_rate": 1e-4}, "unknown setting train.learnin_rate"),
    ({"rounds": True}, "rounds = true: expected an integer"),
    # issue 30.4: each refused before anything runs, named, never "nothing to train"
    ({"rounds": "3"}, "rounds = '3': expected an integer"),
    ({"gate.tolerance": float("nan")}, "gate.tolerance = NaN: expected a number"),
    ({"gate.tolerance": -0.1}, "tolerance must be 0 or more"),
    ({"watch.margin": float("nan")}, "watch.margin = NaN: expected a number"),
    ({"temperature": -1.0}, "temperature must be 0 or more"),
    ({"minutes": 0}, "minutes must be more than 0"),
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
])
def test_training_settings_are_checked(settings, problem):
    _refused(settings, problem)


def _refused(settings, problem):
    """Each setting as a file gives it (dotted: a table's); refused with the key named."""
    values: dict = dict(model="m", agents=["a"], team="t", tasks="t.jsonl",
                        gate={"rule": "off"})
    for key, value in settings.items():
        table, _, name = key.rpartition(".")
        (values.setdefault(table, {}) if table else values)[name] = value
    with pytest.raises(ValueError, match=problem):
        build(LoopConfig, values, "loop.toml").check()


@pytest.mark.parametrize("live, candidate, rule, publish", [
    ({"a": 1, "b": 1, "c": 0}, {"a": 1, "b": 1, "c": 0}, "not_worse", True),
    ({"a": 1, "b": 1, "c": 1, "d": 1}, {"a": 0, "b": 0, "c": 0, "d": 0}, "not_worse", False),
    ({"a": 1, "b": 0, "c": 1, "d": 0}, {"a": 0, "b": 1, "c": 0, "d": 1}, "not_worse", True),
    ({"a": 0, "b": 0, "c": 0}, {"a": 1, "b": 1, "c": 1}, "better", True),
    ({"a": 0, "b": 1, "c": 0}, {"a": 1, "b": 0, "c": 1}, "better", False),
    ({"a": 1}, {"b": 0}, "not_worse", False),  # nothing scored for both: refused
    ({"a": 1}, {"b": 0}, "off", True),
])
def test_gate_rules(live, candidate, rule, publish):
    decision = gate(live, candidate, rule=rule)
    assert decision.publish is publish, decision.rule


ZEROS = {t: 0.0 for t in "abcdef"}


@pytest.mark.parametrize("live, candidate, roles, rule, publish, refused_by", [
    # the team at 0 either way: only the solver's own score shows its regression
    (Scores(ZEROS, {"solver": dict.fromkeys("abcdef", 1.0)}),
     Scores(ZEROS, {"solver": dict.fromkeys("abcdef", 0.0)}), ["solver"], "not_worse", False,
     ["solver"]),
    # the same, but the solver's adapter did not change: its score is not gated
    (Scores(ZEROS, {"solver": dict.fromkeys("abcdef", 1.0)}),
     Scores(ZEROS, {"solver": dict.fromkeys("abcdef", 0.0)}), ["checker"], "not_worse", True,
     []),
    # the team better beyond noise ("better") while a role only holds: published
    (Scores(ZEROS, {"solver": {"a": 1.0, "b": 0.0}}),
     Scores(dict.fromkeys("abcdef", 1.0), {"solver": {"a": 0.0, "b": 1.0}}), ["solver"],
     "better", True, []),
    # a role with no scores on one side is not gated; the team decides
    (Scores(ZEROS, {}), Scores(ZEROS, {"solver": {"a": 0.0}}), ["solver"], "not_worse", True,
     []),
    # off: nothing refused
    (Scores(ZEROS, {"solver": dict.fromkeys("abc", 1.0)}),
     Scores(ZEROS, {"solver": dict.fromkeys("abc", 0.0)}), ["solver"], "off", True, []),
])
def test_each_changed_role_is_gated_on_its_own_score(live, candidate, roles, rule, publish,
                                                    refused_by):
    verdict = decide(live, candidate, roles, rule=rule)
    assert verdict.publish is publish
    assert verdict.published == (roles if publish else [])
    assert [r for r, d in verdict.roles.items() if not d.publish] == refused_by


WORSE = dict.fromkeys("abcdef", 0.0)
BETTER = dict.fromkeys("abcdef", 1.0)


@pytest.mark.parametrize("live, candidate, partial, published", [
    # one role worse, the team not: refused whole, or under partial the other role goes live
    (Scores(ZEROS, {"s": BETTER, "c": BETTER}), Scores(ZEROS, {"s": BETTER, "c": WORSE}),
     False, []),
    (Scores(ZEROS, {"s": BETTER, "c": BETTER}), Scores(ZEROS, {"s": BETTER, "c": WORSE}),
     True, ["s"]),
    # the team worse: nothing, partial or not
    (Scores(BETTER, {"s": BETTER, "c": BETTER}), Scores(WORSE, {"s": BETTER, "c": WORSE}),
     True, []),
    # every role worse: nothing
    (Scores(ZEROS, {"s": BETTER, "c": BETTER}), Scores(ZEROS, {"s": WORSE, "c": WORSE}),
     True, []),
    # nothing worse: both, partial or not
    (Scores(ZEROS, {"s": WORSE, "c": WORSE}), Scores(ZEROS, {"s": BETTER, "c": WORSE}),
     False, ["s", "c"]),
])
def test_a_partial_gate_publishes_the_roles_that_passed(live, candidate, partial, published):
    verdict = decide(live, candidate, ["s", "c"], partial=partial)
    assert verdict.published == published
    record = verdict.record(temperature=0.0, rollouts=1)
    assert record["publish"] is bool(published)
    assert record.get("partial") == (published if published and published != ["s", "c"]
                                     else None)
    if published != ["s", "c"]:
        assert "role c worse" in record["rule"] or "role s worse" in record["rule"] \
            or not record["team_publish"]


def test_a_partial_gate_publishes_the_better_role_and_keeps_the_worse_ones_live_version(
        tmp_path, tiny):
    """Two agents; the team's score is always 0, so the team gate passes; the checker's v1
    answers wrongly. The solver's v1 goes live, the checker keeps the base model, and the
    checker's refused candidate is unloaded from the server."""
    with server_for(bad={"checker@v1"}) as server:
        data = Loop(setup(tmp_path, tiny, server, rounds=1, agents=["solver", "checker"],
                          team=TEAM + " --checker --team-fails", **{"gate.partial": True})
                    ).run()
    (r0,) = data["rounds"]
    assert r0["gate"]["publish"] is True and r0["gate"]["partial"] == ["solver"]
    assert "role checker worse" in r0["gate"]["rule"]
    assert r0["published"] == {"solver": "solver@v1"}
    assert data["live"] == {"solver": "solver@v1", "checker": "base"}
    assert "solver@v1" in server.adapters and "checker@v1" not in server.adapters
    refused = [e for e in data["events"] if e["event"] == "refused"]
    assert [list(e["candidate"]) for e in refused] == [["checker"]]


@pytest.mark.parametrize("lines, expected", [
    ([{"task_id": "a", "agent_score": {"s": 1}}, {"task_id": "a", "agent_score": {"s": 0}}],
     {"s": {"a": 0.5}}),
    ([{"task_id": "a", "agent_correct": {"s": True, "c": False}}], {"s": {"a": 1.0},
                                                                   "c": {"a": 0.0}}),
    # agent_score first; a non-number, NaN, a missing task or a non-object are skipped
    ([{"task_id": "a", "agent_score": {"s": 0.25}, "agent_reward": {"s": 9}},
      {"task_id": "b", "agent_score": {"s": "x", "c": float("nan")}},
      {"agent_score": {"s": 1}}, {"task_id": "c", "agent_score": [1]}], {"s": {"a": 0.25}}),
])
def test_role_scores_from_the_teams_result_lines(lines, expected):
    assert role_scores(lines) == expected


def test_the_gate_samples_as_served_and_refuses_a_role_that_got_worse(tmp_path, tiny):
    """The team's score is 0 whatever the versions (``--team-fails``): the team gate alone
    passes every candidate. v1 answers wrongly: the solver's own score refuses it, and the gate
    played each task twice at the rollouts' temperature, not greedily."""
    with server_for(bad={"solver@v1"}) as server:
        data = Loop(setup(tmp_path, tiny, server, rounds=1, team=TEAM + " --team-fails",
                          temperature=0.7)).run()
    (r0,) = data["rounds"]
    gate_record = r0["gate"]
    assert gate_record["team_publish"] is True and gate_record["difference"] == 0.0
    assert gate_record["publish"] is False and "role solver worse" in gate_record["rule"]
    assert gate_record["roles"]["solver"]["difference"] == -1.0
    assert data["live"] == {"solver": "base"} and "solver@v1" not in server.adapters
    played = [json.loads(line) for line in
              (tmp_path / "loop" / "round00" / "gate-candidate" /
               "results.jsonl").read_text().splitlines()]
    assert {(p["temperature"], p["rollouts"]) for p in played} == {(0.7, 2)}
    assert len(played) == 12  # 6 gate tasks x 2
    baseline = [json.loads(line) for line in
                (tmp_path / "loop" / "baseline" / "results.jsonl").read_text().splitlines()]
    assert {(p["temperature"], p["rollouts"]) for p in baseline} == {(0.0, 1)}  # eval: greedy


def test_paired_interval_by_hand():
    n, l_mean, c_mean, diff, low, high = paired({"a": 1, "b": 0, "c": 1}, {"a": 1, "b": 1,
                                                                         "c": 0, "x": 5})
    assert (n, l_mean, c_mean, diff) == (3, pytest.approx(2 / 3), pytest.approx(2 / 3), 0.0)
    half = 1.959964 * 1.0 / 3 ** 0.5  # differences 0, 1, -1: sd 1
    assert (low, high) == (pytest.approx(-half), pytest.approx(half))


@pytest.mark.parametrize("previous, current, verdict", [
    ([1.0] * 10, [0.0] * 10, "rollback"),
    ([1.0, 0.0] * 5, [1.0, 0.0] * 5, "keep"),
    ([1.0] * 10, [0.98] * 10, "keep"),  # below by less than the margin
    ([1.0, 0.0] * 5, [0.0, 1.0, 0.0] * 3 + [0.0], "keep"),  # lower, within noise
    ([1.0] * 10, [0.0] * 3, "wait"),
])
def test_watch_rules(previous, current, verdict):
    assert watch(previous, current, margin=0.05, min_episodes=5).verdict == verdict


@pytest.mark.parametrize("settings, problem", [
    ({"judge.rubric": "rubric.toml"}, "judge.rubric scores a live traces directory"),
    ({"team": None, "tasks": None, "traces": "live", "judge.rubric": "missing.toml"},
     "is not a rubric file"),
    ({"team": None, "tasks": None, "traces": "live", "judge.rubric": "rubric.toml",
      "judge.mode": "pairs"}, "judge.mode = 'pairs': expected one of 'absolute', 'relative'"),
    ({"team": None, "tasks": None, "traces": "live", "judge.rubric": "rubric.toml",
      "judge.max_episodes": 0}, "max_episodes must be at least 1"),
    ({"team": None, "tasks": None, "traces": "live", "judge.rubric": "rubric.toml",
      "judge.extra_body": [5]}, r"judge.extra_body = \[5\]: expected a table"),
    ({"judge.max_episode_chars": 10}, "max_episode_chars must be at least 100"),
])
def test_judge_settings_are_checked(tmp_path, monkeypatch, settings, problem):
    monkeypatch.chdir(tmp_path)
    Path("rubric.toml").write_text('name = "x"\ninstructions = "y"\n')
    _refused(settings, problem)


def test_a_loop_file_with_tables_gives_the_stages_their_settings(tmp_path):
    """The loop's file nests each stage's settings as its table, with the stage's names; what
    it does not set keeps the stage's one default."""
    path = tmp_path / "loop.toml"
    path.write_text('model = "m"\nagents = ["a"]\nteam = "t"\ntasks = "t.jsonl"\n'
                    '[train]\nlearning_rate = 3e-4\nobjective = "sft"\n'
                    '[convert]\nalpha = 0.5\nbaseline = "group,batch"\n'
                    '[gate]\nrule = "off"\n')
    from agl_bridge.settings import read_file
    from agl_bridge.trainer.training.config import GRPOConfig

    cfg = build(LoopConfig, read_file(path), str(path)).check()
    assert cfg.train.learning_rate == 3e-4 and cfg.train.objective == "sft"
    assert cfg.train.lora_r == GRPOConfig().lora_r  # the training stage's default
    assert cfg.convert.alpha == 0.5 and cfg.convert.baselines == ("group", "batch")
    assert cfg.gate.rule == "off"
    path.write_text('model = "m"\n[train]\nlearning_rate = "high"\n')
    with pytest.raises(SettingError, match=f"{path}: train.learning_rate = 'high': expected "
                                           "a number"):
        build(LoopConfig, read_file(path), str(path))


def test_a_loop_adopts_a_registry_filled_before_it(tmp_path, tiny):
    """Issue 29.5: a registry whose live versions came from elsewhere (``agl-bridge publish``,
    another run) is where a new loop starts: it trains on from the live adapter and publishes
    the next number; a workdir whose adapter of that number is another one is refused before
    anything is waited for or trained."""
    with server_for(bad=set()) as server:
        first = Loop(setup(tmp_path, tiny, server, rounds=1, eval_tasks=None,
                           **{"gate.rule": "off"})).run()
        assert first["live"] == {"solver": "solver@v1"}
        elsewhere = tmp_path / "loop" / "adapters" / "solver" / "v0001"
        again = setup(tmp_path, tiny, server, rounds=1, eval_tasks=None,
                      workdir=str(tmp_path / "loop2"), **{"gate.rule": "off"})
        data = Loop(again).run()
        (r0,) = data["rounds"]
        assert r0["live_before"] == {"solver": "solver@v1"}  # adopted, not base
        adopted = tmp_path / "loop2" / "adapters" / "solver" / "v0001"
        assert adopted.is_symlink() and adopted.resolve() == elsewhere.resolve()
        assert r0["published"] == {"solver": "solver@v2"} and data["live"] == {
            "solver": "solver@v2"}
        meta = json.loads((tmp_path / "loop2" / "adapters" / "solver" / "v0002" /
                           "agl_bridge_adapter.json").read_text())
        assert "v0001" in json.dumps(meta)  # trained on from the adopted version

        clash = tmp_path / "loop3" / "adapters" / "solver" / "v0002"
        clash.mkdir(parents=True)  # this workdir's own v2, not the registry's
        t0 = time.monotonic()
        with pytest.raises(ValueError, match=r"solver@v2 is .*another adapter.*new --workdir"):
            Loop(setup(tmp_path, tiny, server, workdir=str(tmp_path / "loop3"))).run()
        assert time.monotonic() - t0 < 30 and not (tmp_path / "loop3" / "round00").exists()


@pytest.mark.parametrize("scored_by", ["results", "rewards"])
def test_a_live_service_is_gated_on_its_real_inputs_replayed(tmp_path, tiny, scored_by):
    """Issue 29.6: no held-out tasks, no harness: the gate replays the round's newest real
    inputs on the live version and on the candidate and compares them with the interval rule,
    scored by the team's results, or (a team that writes none) by the episodes' rewards."""
    from agl_bridge.aliases import AliasTable
    from agl_bridge.trainer.loop.team import run_team

    team = TEAM if scored_by == "results" else (
        f"sh -c 'AGL_BRIDGE_RESULTS=/dev/null exec {sys.executable} {AGENTS / 'loop_team.py'}'")
    with server_for(bad={"solver@v1"}) as server:
        aliases = AliasTable(tmp_path / "prod-aliases.json")
        aliases.write({"solver": "base"})
        run_team(TEAM, [{"task_id": f"p{i}", "number": i} for i in range(6)],
                 tmp_path / "prod", base_url=server.base_url, aliases=aliases.path)
        server.requests.clear()
        cfg = setup(tmp_path, tiny, server, team=None, tasks=None,
                    traces=str(tmp_path / "prod" / "spans"), settle_s=0.0, min_episodes=6,
                    max_wait_s=5.0, rounds=1, eval_tasks=None, replay_team=team,
                    replay_field="app.number", **{"gate.inputs": 4})
        data = Loop(cfg).run()
        asked = {(b["model"], b["messages"][-1]["content"]) for b in server.requests
                 if b.get("messages") and b["messages"][-1]["content"].startswith("say")}
    (r0,) = data["rounds"]
    assert r0["gate"]["n"] == 4 and r0["gate"]["publish"] is False
    assert r0["gate"]["live"] == 1.0 and r0["gate"]["candidate"] == 0.0
    assert asked >= {(m, f"say {n}") for m in ("base", "solver@v1") for n in (2, 3, 4, 5)}
    assert data["live"] == {"solver": "base"} and "solver@v1" not in server.adapters


def test_gate_inputs_need_live_traces_and_a_replay_command():
    on = {"gate.rule": "not_worse"}
    _refused({**on, "gate.inputs": 4}, "gate.inputs replays real inputs of a live traces")
    _refused({**on, "team": None, "tasks": None, "traces": "live"},
             re.escape("gate.inputs (real inputs replayed: a live service)"))
    _refused({**on, "gate.inputs": -1}, "inputs must be 0 or more")


def test_an_error_in_training_stops_the_loop_and_only_no_data_goes_on(tmp_path, tiny,
                                                                       monkeypatch):
    """Issue 30.4: the loop took any ValueError from training as "nothing to train on" and
    went on (exit 0, nothing trained); only NothingToTrain is that now."""
    import agl_bridge.trainer.training.from_traces as from_traces
    from agl_bridge.trainer.training.config import NothingToTrain

    def broken(*args, **kwargs):
        raise ValueError("a bug, not an empty round")

    monkeypatch.setattr(from_traces, "train_from_traces", broken)
    with server_for(bad=set()) as server:
        with pytest.raises(ValueError, match="a bug, not an empty round"):
            Loop(setup(tmp_path, tiny, server, rounds=1, eval_tasks=None,
                       **{"gate.rule": "off"})).run()

        def empty(*args, **kwargs):
            raise NothingToTrain("no transitions from the round")

        monkeypatch.setattr(from_traces, "train_from_traces", empty)
        data = Loop(setup(tmp_path, tiny, server, rounds=1, eval_tasks=None,
                          workdir=str(tmp_path / "loop2"), **{"gate.rule": "off"})).run()
    assert data["rounds"][0]["trained"] is False


def test_a_server_that_restarted_between_rounds_gets_the_live_versions_again(tmp_path, tiny):
    """Issue 30.2: the loop reconciles the server with the registry at each round: after a
    restart (the server's adapters gone), the live version is loaded again before the team
    plays, instead of every call answering 404."""

    class Restart(LoopCallback):
        def on_round_end(self, loop, directory, record):
            server.adapters.clear()

    with server_for(bad=set()) as server:
        data = Loop(setup(tmp_path, tiny, server, eval_tasks=None, **{"gate.rule": "off"}),
                    callbacks=[Restart()]).run()
    r0, r1 = data["rounds"]
    assert r0["published"] == {"solver": "solver@v1"} and "reloaded" not in r0
    assert r1["reloaded"] == [f"solver@v1 on {server.base_url.removesuffix('/v1')}"]
    assert r1["team"]["episodes"] == 8 and r1["published"] == {"solver": "solver@v2"}


def test_one_loop_per_workdir_and_per_registry(tmp_path, tiny):
    """Issue 30.3: two loops on one workdir both exited 0 with state.json and the alias table
    disagreeing; two on one registry scored each other's weights. The second is refused at the
    start, naming the holder; a finished (or killed) loop lets the next one in."""
    with server_for(bad=set()) as server:
        first = Loop(setup(tmp_path, tiny, server, rounds=1, eval_tasks=None,
                           **{"gate.rule": "off"}))
        with pytest.raises(ValueError,
                           match=rf"another loop runs on workdir .* \(pid {os.getpid()}\)"):
            Loop(setup(tmp_path, tiny, server), fresh=True)
        assert (tmp_path / "loop" / "state.json").exists()  # --fresh wiped nothing
        with pytest.raises(ValueError, match="another loop runs on registry"):
            Loop(setup(tmp_path, tiny, server, workdir=str(tmp_path / "other")))
        first.run()
        Loop(setup(tmp_path, tiny, server, workdir=str(tmp_path / "other"))).release()
    code = ("import sys, time; from agl_bridge.trainer.loop.engine import _exclusive; "
            "from pathlib import Path; _exclusive(Path(sys.argv[1]), 'x'); print('held', "
            "flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "w" / ".loop.lock")],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with server_for(bad=set()) as server:  # the kernel dropped the killed holder's lock
        Loop(setup(tmp_path, tiny, server, workdir=str(tmp_path / "w"))).release()


def test_two_runs_on_one_server_never_share_a_served_name(tmp_path, tiny):
    """Issue 30.3: a second run (its own workdir and registry) on the same server trained its
    own ``solver@v1``; "already loaded" served it the first run's weights, in its gate and
    live. Its version is served as ``solver@v1-<digest>`` in the gate and after the publish;
    the first run's agents keep theirs."""
    from agl_bridge.trainer.serving.publisher import adapter_digest

    with server_for(bad=set()) as server:
        a = Loop(setup(tmp_path / "a", tiny, server, rounds=1)).run()
        # another run, another adapter (the same settings and data train the same one here,
        # which may share the name)
        b = Loop(setup(tmp_path / "b", tiny, server, rounds=1, **{"train.lora_alpha": 4})).run()
        mine = tmp_path / "b" / "loop" / "adapters" / "solver" / "v0001"
        own = f"solver@v1-{adapter_digest(mine)[:8]}"
        assert a["live"] == {"solver": "solver@v1"} and b["live"] == {"solver": own}
        assert b["rounds"][0]["candidate"] == {"solver": own}
        assert {k: Path(v).resolve() for k, v in server.adapters.items()} == {
            "solver@v1": tmp_path / "a" / "loop" / "adapters" / "solver" / "v0001",
            own: mine}


def test_a_candidate_left_loaded_by_a_kill_during_the_gate_is_unloaded(tmp_path, tiny,
                                                                       monkeypatch):
    """Issue 30.3: a kill during the gate left the candidate loaded with no record, never
    unloaded. The candidate is recorded before it is loaded and unloaded when the loop starts
    again, before anything else reaches the server."""
    import agl_bridge.trainer.loop.engine as engine

    real_gate = engine.decide

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # what SIGTERM/SIGINT become inside the loop

    with server_for(bad=set()) as server:
        cfg = setup(tmp_path, tiny, server, rounds=1)
        monkeypatch.setattr(engine, "decide", killed)
        with pytest.raises(SystemExit):
            Loop(cfg).run()
        assert "solver@v1" in server.adapters  # loaded for the gate, then the kill
        saved = json.loads((tmp_path / "loop" / "state.json").read_text())
        assert saved["candidates_loaded"] == ["solver@v1"]
        monkeypatch.setattr(engine, "decide", real_gate)
        server.requests.clear()
        data = Loop(cfg).run()
        calls = [(b.get("lora_name"), "unload" if "lora_path" not in b else "load")
                 for b in server.requests if "lora_name" in b]
    assert calls[0] == ("solver@v1", "unload") and "solver@v1" not in server.adapters
    assert data["live"] == {"solver": "solver@v2"}  # the round again: its next version
    assert "candidates_loaded" not in data


def test_a_slide_over_two_versions_is_rolled_back_to_the_best_recent_one():
    """Issue 30: users' success went 61% (v5) -> 54% (v6) -> 41% (v7) and stayed: each step
    was within noise of the one before, which was all the watch compared. It now compares with
    the best of the recent versions (``[watch] window``) and goes back to that one."""
    from agl_bridge.trainer.loop.watch import best_recent

    def served(k, n=64):
        return [1.0] * k + [0.0] * (n - k)

    v5, v6, v7 = served(51), served(45), served(38)
    assert watch(v6, v7, margin=0.05, min_episodes=32).verdict == "keep"  # the old rule
    recent = [("v4", [1.0]), ("v5", v5), ("v6", v6)]  # v4: too few episodes to count
    best = best_recent(recent)
    assert recent[best][0] == "v5"
    decision = watch(recent[best][1], v7, margin=0.05, min_episodes=32)
    assert decision.verdict == "rollback" and decision.high < 0
    assert best_recent([("a", [1.0]), ("b", [])]) == 1  # none counts: the newest


def _ppo_loop_file(tmp_path, tiny, server, extra=""):
    """The loop's file as a user writes it: setup()'s settings, with ``[convert] algorithm =
    "ppo"``; ``extra`` is added to the ``[train]`` table."""
    write_tasks(tmp_path / "train.jsonl", [{"task_id": f"t{i}", "number": i} for i in range(12)])
    write_tasks(tmp_path / "eval.jsonl", [{"task_id": f"e{i}", "number": 100 + i}
                                          for i in range(6)])
    q = json.dumps
    path = tmp_path / "loop.toml"
    path.write_text(
        f"workdir = {q(str(tmp_path / 'loop'))}\nmodel = {q(str(tiny))}\n"
        f"server = {q(server.base_url)}\nagents = [\"solver\"]\nteam = {q(TEAM)}\n"
        f"tasks = {q(str(tmp_path / 'train.jsonl'))}\ntasks_per_round = 4\nrollouts = 2\n"
        f"eval_tasks = {q(str(tmp_path / 'eval.jsonl'))}\nrounds = 2\nminutes = 30\n"
        f"[serve]\nregistry = {q(str(tmp_path / 'registry'))}\n"
        "[train]\nlearning_rate = 1e-2\nper_device_train_batch_size = 4\nlora_r = 4\n"
        f"lora_alpha = 8\npolicy = \"per_agent_lora\"\n{extra}"
        "[watch]\nepisodes = 4\n"
        "[convert]\nmissing_reward = \"drop\"\nalgorithm = \"ppo\"\n")
    return path


def test_the_loop_trains_with_ppo_and_each_round_continues_the_critic(tmp_path, tiny):
    """Issue 34: ``agl-bridge loop`` with ``[convert] algorithm = "ppo"``: each round trains
    the solver's adapter with a value head beside it, gates and publishes it, and the next
    round continues both from the live version: its critic starts where round 0's ended (a
    new head started at zero, ``[train] value_head_init = "zero"``, predicts 0 on its first
    micro-batch; round 1's does not). The round records hold no GRPO group statistics (ppo
    does not train on them) and the conversion's line says so."""
    from safetensors.torch import load_file

    from agl_bridge.trainer.training.critic import VALUE_HEAD_FILE

    with server_for(bad=set()) as server:
        config = _ppo_loop_file(tmp_path, tiny, server, extra='value_head_init = "zero"\n')
        run = subprocess.run([sys.executable, "-m", "agl_bridge.cli", "loop", "--config",
                              str(config)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads((tmp_path / "loop" / "state.json").read_text())
    r0, r1 = data["rounds"]
    assert r0["published"] == {"solver": "solver@v1"} and r1["published"] == {"solver": "solver@v2"}
    assert r0["transitions"] == 8 and data["live"] == {"solver": "solver@v2"}
    for r in (r0, r1):
        assert "zero_variance_groups" not in r and "baselines" not in r
        assert "ppo: trained on the critic's GAE advantages" in r["conversion"]
    versions = tmp_path / "loop" / "adapters" / "solver"
    heads = [load_file(str(versions / v / VALUE_HEAD_FILE)) for v in ("v0001", "v0002")]
    assert heads[0]["bias"].item() > 0.0  # every episode was rewarded 1
    assert not heads[0]["bias"].equal(heads[1]["bias"])  # round 1 trained it on

    def micro_batches(record):
        return [json.loads(line) for line in Path(record["metrics"]).read_text().splitlines()]

    first0, last0 = micro_batches(r0)[0], micro_batches(r0)[-1]
    first1 = micro_batches(r1)[0]
    assert first0["value_mean"] == 0.0 and last0["value_mean"] > 0.0
    assert first1["value_mean"] != 0.0  # v1's head, read back beside the live adapter
    assert all("value_loss" in m for m in micro_batches(r1))


def test_a_bad_ppo_setting_in_the_loops_file_is_refused_before_anything_runs(tmp_path, tiny):
    with server_for(bad=set()) as server:
        config = _ppo_loop_file(tmp_path, tiny, server, extra="lam = 1.5\n")
        run = subprocess.run([sys.executable, "-m", "agl_bridge.cli", "loop", "--config",
                              str(config)], capture_output=True, text=True, timeout=120)
        asked = len(server.requests)
    assert run.returncode == 2 and re.search(r"lam must be in \[0, 1\], got 1\.5", run.stderr)
    assert not (tmp_path / "loop").exists() and asked == 0  # no workdir, no request


@pytest.mark.parametrize("settings, problem", [
    ({"train.lam": 1.5}, r"lam must be in \[0, 1\], got 1.5"),
    ({"convert.gamma": 1.5}, r"gamma must be in \[0, 1\], got 1.5"),
    ({"train.vf_coef": -0.1}, "vf_coef must be at least 0"),
    ({"train.cliprange_value": 0.0}, "cliprange_value must be positive"),
    ({"train.critic_learning_rate": 0.0}, "critic_learning_rate must be positive"),
    ({"train.rollout_filter_ratio": 0.0}, r"rollout_filter_ratio must be in \(0, 1\]"),
    ({"train.objective": "sft"}, "algorithm ppo trains with objective grpo"),
    ({"train.reward_normalization": {"method": "zscore"}},
     "train.reward_normalization.method = 'zscore': expected one of 'identity'"),
    ({"train.reward_normalization": {"grouping": "task"}},
     "train.reward_normalization.grouping = 'task': expected one of 'state'"),
    # the GRPO family normalises with its baseline: a critic's rewards only
    ({"convert.algorithm": "at_grpo", "train.reward_normalization": {"method": "mean_std"}},
     "'mean_std' normalises the rewards a critic learns: it needs algorithm ppo"),
])
def test_ppo_settings_are_checked(settings, problem):
    _refused({"convert.algorithm": "ppo", **settings}, problem)
