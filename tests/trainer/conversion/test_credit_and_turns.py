"""The converter's semantics on small tables: turns, merging, credit, groups, advantages."""

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agl_bridge.trainer.conversion import ConvertConfig, convert, spans_to_transitions
from agl_bridge.trainer.rewards.advantages import group_advantages
from agl_bridge.trainer.rewards.baselines import task_group_ids as group_ids
from tests.factories import llm, reward, table
from tests.reference_converter import reference_spans_to_transitions


def advantages(rewards, groups, episodes, **options):
    """``group_advantages`` on plain lists: groups and episodes by name."""
    g = np.unique(np.array(groups), return_inverse=True)[1]
    e = np.unique(np.array(episodes), return_inverse=True)[1]
    adv, _, zero = group_advantages(np.array(rewards), g, e, **options)
    return adv.tolist(), zero


def by(out, *cols):
    return [tuple(r[c] for c in cols) for r in out.to_pylist()]


def test_calls_that_extend_the_context_merge_with_observations_masked():
    rows = [llm("e", 1, prompt=[1, 2], completion=[3], logprobs=[-0.5]),
            # tool result [9, 9] between: the next prompt = prompt + completion + observation
            llm("e", 2, prompt=[1, 2, 3, 9, 9], completion=[4, 5], logprobs=[-0.1, -0.2]),
            llm("e", 3, prompt=[1, 2, 3, 9, 9, 4, 5, 8], completion=[6]),
            reward("e", 4, 1.0)]
    out, stats = spans_to_transitions(table(rows))
    (t,) = out.to_pylist()
    assert t["prompt_ids"] == [1, 2]
    assert t["completion_ids"] == [3, 9, 9, 4, 5, 8, 6]
    assert t["completion_mask"] == [1, 0, 0, 1, 1, 0, 1]
    assert t["merged_calls"] == 3
    assert t["behaviour_logprobs"] is None  # the third call had none: unknown, not guessed
    assert stats.transitions == 1 and stats.llm_spans == 3


def test_merged_logprobs_put_zero_at_masked_positions():
    rows = [llm("e", 1, prompt=[1], completion=[2], logprobs=[-0.5]),
            llm("e", 2, prompt=[1, 2, 7], completion=[3], logprobs=[-0.25]),
            reward("e", 3, 1.0)]
    (t,) = spans_to_transitions(table(rows))[0].to_pylist()
    assert t["behaviour_logprobs"] == [-0.5, 0.0, -0.25] and t["completion_mask"] == [1, 0, 1]


def test_a_call_that_does_not_extend_stays_separate_and_is_counted():
    rows = [llm("e", 1, prompt=[1, 2], completion=[3]), llm("e", 2, prompt=[5, 6], completion=[7]),
            reward("e", 3, 1.0)]
    out, stats = spans_to_transitions(table(rows))
    assert by(out, "prompt_ids", "merged_calls") == [([1, 2], 1), ([5, 6], 1)]
    assert stats.notes["call does not extend its turn's context (kept separate)"] == 1


def test_turns_are_inferred_when_spans_carry_none():
    rows = [llm("e", 1, agent="a", turn=None, prompt=[1], completion=[2]),
            llm("e", 2, agent="a", turn=None, prompt=[1, 2, 3], completion=[4]),  # same turn
            llm("e", 3, agent="b", turn=None), llm("e", 4, agent="a", turn=None, prompt=[8]),
            reward("e", 5, 1.0)]
    out, stats = spans_to_transitions(table(rows))
    assert sorted(by(out, "agent_name", "turn_index", "merged_calls")) == [
        ("a", 0, 2), ("a", 1, 1), ("b", 0, 1)]
    assert stats.notes["turn inferred (no turn attribute)"] == 4


def test_turns_come_from_the_coordination_round_when_spans_carry_no_turn():
    rows = [llm("e", 1, agent="a", turn=None, round=0, prompt=[1], completion=[2]),
            llm("e", 2, agent="b", turn=None, round=0),
            llm("e", 3, agent="a", turn=None, round=0, prompt=[1, 2, 3], completion=[4]),
            llm("e", 4, agent="a", turn=None, round=1, prompt=[7]),
            llm("e", 5, agent="b", turn=4, round=1),  # a turn attribute wins
            reward("e", 6, 1.0)]
    for convert_table in (spans_to_transitions, reference_spans_to_transitions):
        out, stats = convert_table(table(rows))
        # a's two calls of round 0 are one turn (merged), though b spoke between them
        assert sorted(by(out, "agent_name", "turn_index", "merged_calls")) == [
            ("a", 0, 2), ("a", 1, 1), ("b", 0, 1), ("b", 4, 1)]
        assert stats.notes["turn from the coordination round (no turn attribute)"] == 4
        assert "turn inferred (no turn attribute)" not in stats.notes


def test_turns_from_rounds_of_real_spans(spans):
    from opentelemetry import trace

    import agl_bridge
    from agl_bridge import semconv as sc
    from tests.span_files import spans_to_table

    def call(prompt, completion):  # an instrumentor's span: the scope processor stamps it
        trace.get_tracer("tests.llm").start_span("chat m", attributes={
            sc.GEN_AI_OPERATION_NAME: "chat", sc.PROMPT_TOKEN_IDS: prompt,
            sc.COMPLETION_TOKEN_IDS: completion}).end()

    with agl_bridge.episode("e", task_id="t"):
        for r in range(2):
            with agl_bridge.coordination_round(r):
                for name in ("solver", "critic"):
                    with agl_bridge.agent(name):
                        call([r, 1], [2])
        agl_bridge.emit_reward(1.0)
    out, stats = spans_to_transitions(spans_to_table(spans.get_finished_spans()))
    assert sorted(by(out, "agent_name", "turn_index", "prompt_ids")) == [
        ("critic", 0, [0, 1]), ("critic", 1, [1, 1]), ("solver", 0, [0, 1]),
        ("solver", 1, [1, 1])]
    assert stats.notes["turn from the coordination round (no turn attribute)"] == 4


def test_at_grpo_mixes_team_and_local_rewards_by_scope():
    rows = [llm("e", 1, agent="a", turn=0), llm("e", 2, agent="a", turn=1),
            llm("e", 3, agent="b", turn=0),
            reward("e", 4, 1.0, scope="team"), reward("e", 5, 0.5, scope="agent", agent="b"),
            reward("e", 6, 0.25, scope="turn", agent="a", turn=1)]
    out, _ = spans_to_transitions(table(rows), ConvertConfig(alpha=2.0))
    assert sorted(by(out, "agent_name", "turn_index", "reward")) == [
        ("a", 0, 2.0), ("a", 1, 2.25), ("b", 0, 2.5)]
    light, _ = spans_to_transitions(table(rows), ConvertConfig(algorithm="lightning_rl"))
    assert {r for (r,) in by(light, "reward")} == {1.0}  # identical assignment: team only
    assert {g for (g,) in by(light, "group_id")} == {"task:t1"}


def test_team_reward_discount_over_turns():
    rows = [llm("e", t, agent="a", turn=t, prompt=[t]) for t in range(3)] + [reward("e", 9, 1.0)]
    out, _ = spans_to_transitions(table(rows), ConvertConfig(gamma=0.5))
    assert by(out, "turn_index", "reward") == [(0, 0.25), (1, 0.5), (2, 1.0)]


def test_k_candidates_of_one_agent_turn_form_one_group_and_tasks_never_share():
    rows = []
    for task, ep_rewards in (("t1", [1.0, 0.0]), ("t2", [5.0, 5.0])):
        for k, r in enumerate(ep_rewards):
            ep = f"{task}-{k}"
            rows += [llm(ep, 1, task=task, candidate=k), reward(ep, 2, r)]
    out, stats = spans_to_transitions(table(rows))
    groups = {g for (g,) in by(out, "group_id")}
    assert groups == {"task:t1|agent:a|turn:0", "task:t2|agent:a|turn:0"}
    advs = dict((ep, a) for ep, a in by(out, "episode_id", "advantage"))
    assert advs["t1-0"] > 0 > advs["t1-1"] and advs["t2-0"] == advs["t2-1"] == 0.0
    assert stats.zero_variance_groups == 1 and stats.groups == 2


def test_group_keys_never_merge_tasks_by_index_arithmetic():
    # a published implementation derived groups by index // K, merging tasks when counts differ
    tasks = ["t1"] * 3 + ["t2"] * 2
    ids = group_ids(pa.array(tasks), pa.array([f"e{i}" for i in range(5)]), pa.array(["a"] * 5),
                    pa.array([0] * 5, pa.int32()), "at_grpo").to_pylist()
    assert [g.split("|")[0] for g in ids] == ["task:t1"] * 3 + ["task:t2"] * 2


def test_advantages_per_transition_or_per_rollout():
    # episode A has three transitions in the group with reward 1, episode B one with reward 0
    rewards, groups, episodes = [1.0, 1.0, 1.0, 0.0], ["g"] * 4, ["A", "A", "A", "B"]
    per_t, _ = advantages(rewards, groups, episodes, unit="transition", eps=0.0)
    per_r, _ = advantages(rewards, groups, episodes, unit="rollout", eps=0.0)
    assert per_t[0] == pytest.approx(0.25 / 0.5)  # mean 0.75, std 0.5
    assert per_r[0] == pytest.approx(0.5 / math.sqrt(0.5))  # mean 0.5 over 2 rollouts
    centred, _ = advantages(rewards, groups, episodes, scale=False)
    assert centred == pytest.approx([0.25, 0.25, 0.25, -0.75])


@pytest.mark.parametrize("unit", ["transition", "rollout"])
def test_equal_rewards_are_zero_variance_exactly(unit):
    # fsum([0.1] * 3) / 3 == 0.10000000000000002: a group of equal rewards used to get a std
    # of 1e-17, was not counted as zero-variance, and got advantages of about 1e-13
    rewards = [0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]
    groups = ["g1"] * 3 + ["g2"] * 6
    episodes = ["A", "B", "C", "A", "A", "B", "C", "C", "C"]  # uneven calls per rollout
    adv, zero = advantages(rewards, groups, episodes, unit=unit)
    assert zero == 2 and adv == [0.0] * 9
    rows = [llm(f"e{i}", 1, task="t", prompt=[i]) for i in range(3)]
    rows += [reward(f"e{i}", 2, 0.1) for i in range(3)]
    out, stats = spans_to_transitions(table(rows), ConvertConfig(advantage_unit=unit))
    assert stats.zero_variance_groups == 1 and out["advantage"].to_pylist() == [0.0] * 3
    ref, ref_stats = reference_spans_to_transitions(table(rows),
                                                    ConvertConfig(advantage_unit=unit))
    assert ref_stats.zero_variance_groups == 1 and ref["advantage"].to_pylist() == [0.0] * 3


def test_spilled_conversion_equals_in_memory(tmp_path):
    rows = []
    for e in range(40):
        rows += [llm(f"e{e}", 1, task=f"t{e % 4}", prompt=[e], completion=[e, 1]),
                 llm(f"e{e}", 2, task=f"t{e % 4}", agent="b"), reward(f"e{e}", 3, float(e % 3))]
    (tmp_path / "spans").mkdir()
    pq.write_table(table(rows[:60]), tmp_path / "spans" / "a.parquet")
    pq.write_table(table(rows[60:]), tmp_path / "spans" / "b.parquet")
    seen = []
    whole = convert(tmp_path / "spans", tmp_path / "whole.parquet")
    spilled = convert(tmp_path / "spans", tmp_path / "spilled.parquet", max_rows_in_memory=20,
                      progress=lambda done, total: seen.append((done, total)))
    a = pq.read_table(tmp_path / "whole.parquet").sort_by("span_id").to_pylist()
    b = pq.read_table(tmp_path / "spilled.parquet").sort_by("span_id").to_pylist()
    assert a == b and len(a) == 80
    assert whole.transitions == spilled.transitions == 80 and len(seen) > 1
    assert seen[-1][0] == seen[-1][1]


def test_unreadable_file_is_counted_and_the_rest_converted(tmp_path):
    pq.write_table(table([llm("e", 1), reward("e", 2, 1.0)]), tmp_path / "good.parquet")
    data = (tmp_path / "good.parquet").read_bytes()
    (tmp_path / "truncated.parquet").write_bytes(data[: len(data) // 2])
    stats = convert(tmp_path, tmp_path / "out" / "t.parquet")
    assert stats.transitions == 1
    assert any("unreadable file skipped: truncated.parquet" in n for n in stats.notes)


def test_clock_skew_is_noted_not_fatal():
    skewed = llm("e", 10)
    skewed["end_time_unix_nano"] = 5
    out, stats = spans_to_transitions(table([skewed, reward("e", 11, 1.0)]))
    assert out.num_rows == 1
    assert stats.notes["span ends before it starts (clock skew; kept)"] == 1


def test_otlp_json_collector_files_convert_like_parquet(tmp_path):
    import json

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agl_bridge import semconv as sc
    from tests.otlp_helpers import otlp_json  # the real OTLP encoder, ids as hex (Collector)

    memory, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for ep, r in (("e1", 1.0), ("e2", 0.0)):
        scope = {sc.EPISODE_ID: ep, sc.TASK_ID: "t", sc.GEN_AI_AGENT_NAME: "a", sc.TURN_INDEX: 0}
        tracer.start_span("chat m", attributes={**scope, sc.GEN_AI_OPERATION_NAME: "chat",
                                                sc.PROMPT_TOKEN_IDS: [1, 2],
                                                sc.COMPLETION_TOKEN_IDS: [3]}).end()
        tracer.start_span(sc.SPAN_REWARD, attributes={**scope, sc.REWARD_VALUE: r}).end()
    path = tmp_path / "collector.jsonl"
    path.write_text(json.dumps(otlp_json(list(memory.get_finished_spans()))) + "\n")
    stats = convert(path, tmp_path / "t.parquet")
    out = pq.read_table(tmp_path / "t.parquet")
    assert stats.transitions == 2
    assert sorted(by(out, "episode_id", "reward", "prompt_ids")) == [
        ("e1", 1.0, [1, 2]), ("e2", 0.0, [1, 2])]
