"""Rewards after the fact: feedback from other processes, files and span events, joined to the
episode it scores at conversion; the same feedback twice counts once (the latest wins)."""

import json
import subprocess
import sys

import pytest

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.cli import main as cli
from agl_bridge.trainer.conversion import reasons, spans_to_transitions
from agl_bridge.trainer.rewards import evaluations as ev
from tests.factories import llm, reward, table
from tests.feedback_runs import clean_env, rewards_by_response, run_app


def test_feedback_from_other_processes_becomes_the_rewards(tmp_path):
    ids = run_app(tmp_path)
    assert len(set(ids)) == 4
    # a separate process, later, with nothing in scope: the support tool's thumbs
    code = ("import sys, agl_bridge; agl_bridge.feedback('response:' + sys.argv[1], 1.0); "
            "agl_bridge.feedback(sys.argv[2], {'helpful': 0.5, 'polite': -0.25})")
    done = subprocess.run([sys.executable, "-c", code, ids[0], ids[1]], capture_output=True,
                          text=True, env=clean_env(AGL_BRIDGE_PARQUET_DIR=str(tmp_path / "traces")))
    assert done.returncode == 0, done.stderr
    # an annotation tool's export, imported with one bad row
    csv = tmp_path / "scores.csv"
    csv.write_text(f"id,value,name\n{ids[2]},-0.5,feedback\n{ids[3]},lots,feedback\n")
    cli = subprocess.run([sys.executable, "-m", "agl_bridge.cli", "feedback", str(csv), "--out",
                          str(tmp_path / "traces")], capture_output=True, text=True,
                         env=clean_env())
    assert cli.returncode == 1
    assert f"{csv}:3: value 'lots' is not a number" in cli.stderr
    assert "1 of 2 feedback row(s)" in cli.stdout
    quarantined = list((tmp_path / "traces" / "_quarantine").glob("*.jsonl"))
    assert quarantined and "lots" in quarantined[0].read_text()
    got, stats = rewards_by_response(tmp_path)
    assert got == {ids[0]: 1.0, ids[1]: 0.25, ids[2]: -0.5}  # exactly the feedback
    assert stats.skipped[reasons.NO_REWARD] == 1  # the fourth request had none
    assert stats.notes[ev.JOINED] == 3 and stats.episodes == 4


def test_the_same_feedback_twice_counts_once_and_the_latest_wins(tmp_path):
    ids = run_app(tmp_path, n=2)
    first = tmp_path / "first.csv"
    first.write_text(f"id,value,time\n{ids[0]},1.0,2026-11-01T10:00:00Z\n{ids[1]},0.5,\n")
    for _ in range(2):  # imported twice
        assert cli(["feedback", str(first), "--out",
                                    str(tmp_path / "traces")]) == 0
    later = tmp_path / "later.jsonl"  # the user changed their mind; an older stray score too
    later.write_text(json.dumps({"id": ids[0], "value": -1.0, "time": "2026-11-02T10:00:00"})
                     + "\n" + json.dumps({"id": ids[0], "value": 7.0, "time": 1000.0}) + "\n")
    assert cli(["feedback", str(later), "--out", str(tmp_path / "traces")]) == 0
    got, stats = rewards_by_response(tmp_path)
    assert got == {ids[0]: -1.0, ids[1]: 0.5}
    assert stats.notes[ev.SUPERSEDED] == 4 and stats.notes[ev.JOINED] == 2


def test_unknown_targets_are_counted_and_listed_and_weights_choose_names(tmp_path):
    ids = run_app(tmp_path, n=2)
    out = str(tmp_path / "traces")
    agl_bridge.feedback(ids[0], 1.0, name="helpful", out=out)
    agl_bridge.feedback(ids[0], 0.2, name="tone", out=out)
    agl_bridge.feedback(ids[1], 1.0, name="helpful", out=out)
    agl_bridge.feedback("response:chatcmpl-nope", 1.0, out=out)
    agl_bridge.feedback("trace:" + "ab" * 16, 1.0, out=out)
    agl_bridge.flush_feedback()
    got, stats = rewards_by_response(tmp_path)
    assert got == {ids[0]: pytest.approx(1.2), ids[1]: 1.0}
    assert stats.notes[ev.UNKNOWN] == 2
    assert sorted(stats.unknown_evaluations) == ["feedback: response:chatcmpl-nope",
                                                 f"feedback: trace:{'ab' * 16}"]
    assert "evaluation for an unknown id: feedback: response:chatcmpl-nope" in stats.summary()
    weighted, stats = rewards_by_response(tmp_path, evaluation_weights={"helpful": 2.0})
    assert weighted == {ids[0]: 2.0, ids[1]: 2.0} and stats.notes[ev.NOT_COUNTED] == 3


def test_bad_feedback_is_refused_at_the_call(tmp_path):
    for target, value, match in [("", 1.0, "non-empty id"), ("e", float("nan"), "finite"),
                                 ("e", True, "real number"), ("trace:xyz", 1.0, "32 hex"),
                                 ("e", {}, "must not be empty"), ("e", {"": 1.0}, "part names")]:
        with pytest.raises((ValueError, TypeError), match=match):
            agl_bridge.feedback(target, value, out=tmp_path)
    with pytest.raises(ValueError, match="kind must be one of"):
        agl_bridge.feedback("e", 1.0, kind="vibes", out=tmp_path)
    env = clean_env()
    code = "import agl_bridge; agl_bridge.feedback('e', 1.0)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode != 0 and "feedback has nowhere to go" in done.stderr


def test_feedback_inside_a_captured_process_targets_its_episode_not_the_current_one(spans):
    from tests.span_files import spans_to_table

    with agl_bridge.episode("e1", task_id="t"), agl_bridge.agent("a"):
        first = agl_bridge.current_episode_id()
    with agl_bridge.episode("e2", task_id="t"), agl_bridge.agent("a"):
        # scored while another episode runs: the score must go to e1, not to e2
        pass
    rows = [llm("e1", 1, agent="a"), llm("e2", 2, agent="a", prompt=[9]),
            reward("e2", 3, 0.0)]
    import pyarrow as pa

    with agl_bridge.episode("e2"):
        agl_bridge.feedback(first, 1.0, agent="a")
    recorded = spans_to_table([s for s in spans.get_finished_spans()
                               if s.name == sc.GEN_AI_EVALUATION_RESULT])
    assert recorded.num_rows == 1 and recorded["episode_id"].to_pylist() == [None]
    out, stats = spans_to_transitions(pa.concat_tables(
        [table(rows), recorded.select(table(rows).column_names)]))
    assert sorted((t["episode_id"], t["reward"]) for t in out.to_pylist()) == [
        ("e1", 1.0), ("e2", 0.0)]
    assert stats.episodes == 2 and stats.notes[ev.JOINED] == 1


def test_evaluation_span_events_score_the_turn_of_the_span_that_holds_them():
    rows = [llm("e", 1, agent="a", turn=0), llm("e", 2, agent="a", turn=1, prompt=[7]),
            llm("e", 3, agent="b", turn=0, prompt=[8]), reward("e", 4, 1.0)]
    rows[1]["events"] = json.dumps([{"name": sc.GEN_AI_EVALUATION_RESULT, "time_unix_nano": 9,
                                     "attributes": {sc.GEN_AI_EVALUATION_NAME: "relevance",
                                                    sc.GEN_AI_EVALUATION_SCORE_VALUE: 0.5}},
                                    {"name": "exception", "attributes": {}}])
    rows[3]["events"] = json.dumps([{"name": sc.GEN_AI_EVALUATION_RESULT, "attributes": {
        sc.GEN_AI_EVALUATION_NAME: "task", sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0}}])
    out, stats = spans_to_transitions(table(rows))
    got = sorted((t["agent_name"], t["turn_index"], t["reward"]) for t in out.to_pylist())
    assert got == [("a", 0, 1.0), ("a", 1, 1.5), ("b", 0, 1.0)]  # the reward's own event: once
    assert stats.notes[ev.JOINED] == 1


@pytest.mark.parametrize("case", [
    # (evaluation fields, expected (episode, scope, agent, turn) or the note)
    ({"episode": "e1", "agent": "a", "turn": 2}, ("e1", "turn", "a", 2)),
    ({"target": "episode:e1"}, ("e1", "episode", None, None)),
    ({"target": "any:e1", "agent": "a"}, ("e1", "agent", "a", None)),
    ({"target": "any:" + "0f" * 16}, ("e2", "episode", None, None)),
    ({"target": "trace:" + "aa" * 16}, ev.AMBIGUOUS),
    ({"target": "response:r9"}, ("e1", "turn", "b", 1)),
    ({"target": "any:r9", "agent": "a"}, ("e1", "agent", "a", None)),
    ({"parent": ("t1", "s1")}, ("e2", "turn", "c", 0)),
    ({"target": "response:nope"}, ev.UNKNOWN),
    ({"trace": "0f" * 16}, ("e2", "episode", None, None)),
    ({"episode": "e1", "scope": "agent"}, ("e1", "episode", None, None)),
])
def test_resolution_rules(case):
    fields, expected = case
    lookup = ev.Lookup(episodes={"e1", "e2"},
                       traces={"0f" * 16: {"e2"}, "aa" * 16: {"e1", "e2"}},
                       responses={"r9": ev.Place("e1", "b", 1)},
                       spans={("t1", "s1"): ev.Place("e2", "c", 0)})
    e = ev.Evaluation(name="n", score=1.0, label=None, time=1, ident="x", **fields)
    out = ev.resolve([e], lookup)
    if isinstance(expected, str):
        assert out.rewards == {} and out.notes[expected] == 1
    else:
        (r,) = out.rewards[expected[0]]
        assert (r.episode, r.scope, r.agent, r.turn) == expected


def test_labels_score_label_only_evaluations():
    lookup = ev.Lookup(episodes={"e"})
    passed = ev.Evaluation("ci", None, "pass", 1, "a", target="episode:e")
    out = ev.resolve([passed], lookup)
    assert out.notes[ev.NO_SCORE] == 1 and not out.rewards
    out = ev.resolve([passed], lookup, labels={"pass": 1.0, "fail": 0.0})
    assert [r.value for r in out.rewards["e"]] == [1.0]


def test_feedback_by_response_id_scores_that_calls_agent_and_turn_only():
    """Issue 29.3: ``feedback("chatcmpl-...")`` on a two-agent, multi-turn episode rewards the
    agent-turn that made that call, not the episode (the record no longer says "episode");
    an episode id still scores the episode, and ``agent=`` that agent's turns."""
    from agl_bridge.evaluations import evaluation_attributes
    from agl_bridge.otel.rows import evaluation_row

    rows = [llm("e", 1, agent="planner", turn=0), llm("e", 2, agent="analyst", turn=0),
            llm("e", 3, agent="planner", turn=1), llm("e", 4, agent="analyst", turn=1)]
    for i, row in enumerate(rows):
        row["response_id"] = f"chatcmpl-{i}"

    def rewards(*feedback):
        records = [evaluation_row(evaluation_attributes(target, value, **kw))
                   for target, value, kw in feedback]
        out, _ = spans_to_transitions(table(rows + records), missing_reward=0.0)
        return {(t["agent_name"], t["turn_index"]): t["reward"] for t in out.to_pylist()}

    assert rewards(("chatcmpl-2", 1.0, {})) == {
        ("planner", 0): 0.0, ("analyst", 0): 0.0, ("planner", 1): 1.0, ("analyst", 1): 0.0}
    assert rewards(("response:chatcmpl-1", -1.0, {"agent": "analyst"})) == {
        ("planner", 0): 0.0, ("analyst", 0): -1.0, ("planner", 1): 0.0, ("analyst", 1): 0.0}
    assert set(rewards(("e", 1.0, {})).values()) == {1.0}  # an episode id: every transition
    assert rewards(("episode:e", 1.0, {"agent": "planner"})) == {
        ("planner", 0): 1.0, ("analyst", 0): 0.0, ("planner", 1): 1.0, ("analyst", 1): 0.0}


def test_one_row_past_the_range_of_a_number_is_quarantined_and_the_rest_imported(tmp_path):
    """Issue 30.5: a time of 1e300, parts that sum past the float range or an integer of 400
    digits raised OverflowError: 0 rows stored, nothing quarantined, and a good file given in
    the same call lost too. Now each is one bad row, named, and everything else is kept."""
    from agl_bridge.otel.feedback_files import import_feedback

    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(json.dumps(r) for r in [
        {"id": "e1", "value": 1.0, "time": 1e300},
        {"id": "e1", "value": {"a": 1e308, "b": 1e308}},
        {"id": "e1", "value": 10 ** 400},
        {"id": "e1", "value": 1.0, "time": -5},
        {"id": "e1", "value": 0.5, "time": "2026-11-02T10:00:00Z"},
    ]) + "\n")
    good = tmp_path / "good.csv"
    good.write_text("id,value\ne2,1.0\n")
    summary = import_feedback([bad, good], tmp_path / "traces")
    assert (summary.rows, summary.imported, summary.bad_count) == (6, 2, 4)
    assert [line.split(": ", 1)[0] for line in summary.bad] == [f"{bad}:{n}" for n in (1, 2, 3, 4)]
    assert "between 1970 and 2262" in summary.bad[0] and "sum past" in summary.bad[1]
    assert "401 digits" in summary.bad[2]
    quarantined = list((tmp_path / "traces" / "_quarantine").glob("*.jsonl"))
    assert sum(len(q.read_text().splitlines()) for q in quarantined) == 4
