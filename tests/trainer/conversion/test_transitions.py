import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agl_bridge.parquet_io import SchemaError
from agl_bridge.schema import TRANSITION_SCHEMA
from agl_bridge.trainer.conversion import ConvertConfig, convert, read_spans, spans_to_transitions
from tests.factories import llm, reward, table


def test_episode_reward_reaches_every_call_of_its_episode_only():
    # two episodes interleaved in time, as concurrent rollouts are: rewards must not cross
    rows = [llm("e1", 1), llm("e2", 2), llm("e1", 3, agent="b"), reward("e2", 4, 0.25),
            llm("e2", 5, agent="b"), reward("e1", 6, 1.0)]
    out, stats = spans_to_transitions(table(rows))
    assert out.schema.equals(TRANSITION_SCHEMA, check_metadata=False)
    got = [(r["episode_id"], r["agent_name"], r["reward"]) for r in out.to_pylist()]
    assert sorted(got) == [("e1", "a", 1.0), ("e1", "b", 1.0), ("e2", "a", 0.25),
                           ("e2", "b", 0.25)]
    assert stats.transitions == 4 and stats.episodes == 2 and not stats.skipped
    r = out.to_pylist()[0]
    assert r["completion_mask"] == [1, 1] and r["group_id"] == "task:t1|agent:a|turn:0"
    assert r["merged_calls"] == 1 and r["retokenized"] is False


def test_calls_without_token_ids_are_skipped_and_counted():
    rows = [llm("e1", 1, prompt=None), llm("e1", 2, completion=None), llm("e1", 3, completion=()),
            llm("e1", 4), reward("e1", 5, 1.0)]
    out, stats = spans_to_transitions(table(rows))
    assert out.num_rows == 1
    assert stats.skipped == {"no token ids on the LLM span": 2, "empty completion": 1}
    assert "skipped 2 LLM call(s): no token ids" in stats.summary()


def test_missing_reward_policy():
    rows = [llm("e1", 1), llm("e2", 2), reward("e2", 3, 0.5)]
    out, stats = spans_to_transitions(table(rows))
    assert [r["episode_id"] for r in out.to_pylist()] == ["e2"]
    assert stats.skipped["episode has no reward"] == 1
    out, stats = spans_to_transitions(table(rows), missing_reward=0.0)
    assert sorted((r["episode_id"], r["reward"]) for r in out.to_pylist()) == [
        ("e1", 0.0), ("e2", 0.5)]


def test_several_rewards_add_up_and_bad_ones_are_noted():
    rows = [llm("e1", 1), reward("e1", 2, 0.5), reward("e1", 3, 0.25, scope="team"),
            reward("e1", 4, math.nan), reward("e1", 5, 9.0, scope="turn")]
    out, stats = spans_to_transitions(table(rows))
    assert out.to_pylist()[0]["reward"] == 0.75
    notes = " | ".join(stats.notes)
    assert "non-finite reward (rejected)" in notes
    assert "turn-scoped reward without agent and turn (ignored)" in notes
    assert stats.rejected_rewards and stats.rejected_rewards[0].startswith("nan in episode e1")


def test_duplicates_orphans_and_trace_fallback():
    dup = llm(None, 1, trace="TR1")
    rows = [dup, dict(dup), reward(None, 2, 1.0, trace="TR1"), llm(None, 3, trace="TR2",
            task=None), reward(None, 4, 0.0, trace="TR2")]
    out, stats = spans_to_transitions(table(rows), ConvertConfig(baseline="group"))
    got = sorted((r["episode_id"], r["group_id"].split("|")[0]) for r in out.to_pylist())
    assert got == [("trace:TR1", "task:t1"), ("trace:TR2", "episode:trace:TR2")]
    assert stats.notes["duplicate span id (later copy ignored)"] == 1


def test_logprobs_of_the_wrong_length_are_dropped_not_fatal():
    rows = [llm("e1", 1, logprobs=[-0.1]), llm("e1", 2, logprobs=[-0.1, -0.2]),
            reward("e1", 3, 1.0)]
    out, stats = spans_to_transitions(table(rows))
    got = [r["behaviour_logprobs"] for r in out.to_pylist()]
    assert got[0] is None and got[1] == pytest.approx([-0.1, -0.2])  # stored as float32
    assert stats.notes["logprobs length differs from completion (logprobs dropped)"] == 1


def test_a_null_inside_an_id_list_counts_as_no_list(tmp_path):
    # capture never writes one; a hand-built table can. The output (lists declared without
    # nulls inside) must still write, and nothing is silently dropped.
    rows = [llm("e1", 1, prompt=(1, None)), llm("e1", 2, logprobs=[-0.1, None]),
            llm("e1", 3, agent="b"), reward("e1", 4, 1.0)]
    out, stats = spans_to_transitions(table(rows))
    assert out.num_rows == 2
    assert stats.notes["null inside an id or logprob list (the list is ignored)"] == 2
    assert stats.skipped == {"no token ids on the LLM span": 1}
    got = [r["behaviour_logprobs"] for r in out.to_pylist()]
    assert got == [None, None]  # the holey logprobs are gone, the other call sent none
    pq.write_table(out, tmp_path / "t.parquet")  # would raise on a null declared impossible
    assert pq.read_table(tmp_path / "t.parquet").num_rows == 2


def test_span_files_of_earlier_schema_versions_convert_the_same(tmp_path):
    # version 2 declared nullable values inside the id lists; version 1 lacked the round
    rows = table([llm("e1", 1, logprobs=[-0.5, -0.25]), llm("e1", 2, agent="b"),
                  reward("e1", 3, 1.0)])
    pq.write_table(rows, tmp_path / "v3.parquet")
    old = pa.schema([f.with_type(pa.list_(f.type.value_type)) if pa.types.is_list(f.type) else f
                     for f in rows.schema if f.name != "coordination_round"])
    pq.write_table(rows.drop_columns(["coordination_round"]).cast(old), tmp_path / "v1.parquet")
    assert pq.read_schema(tmp_path / "v1.parquet").field("prompt_token_ids").type.value_field\
        .nullable
    convert(tmp_path / "v3.parquet", tmp_path / "a.parquet")
    convert(tmp_path / "v1.parquet", tmp_path / "b.parquet")
    a, b = pq.read_table(tmp_path / "a.parquet"), pq.read_table(tmp_path / "b.parquet")
    assert a.num_rows == 2 and a.equals(b)
    assert a.schema.equals(TRANSITION_SCHEMA, check_metadata=False)


def test_convert_reads_a_directory_tree_and_writes_parquet(tmp_path):
    (tmp_path / "spans" / "date=2026-11-21").mkdir(parents=True)
    pq.write_table(table([llm("e1", 1), reward("e1", 2, 1.0)]),
                   tmp_path / "spans" / "date=2026-11-21" / "a.parquet")
    pq.write_table(table([llm("e2", 1), reward("e2", 2, 0.0)]), tmp_path / "spans" / "b.parquet")
    (tmp_path / "spans" / ".tmp-x-c.parquet").write_bytes(b"half a file")  # a writer at work
    stats = convert(tmp_path / "spans", tmp_path / "out" / "transitions.parquet")
    assert stats.transitions == 2
    assert pq.read_table(tmp_path / "out" / "transitions.parquet").num_rows == 2


def test_missing_column_is_named_with_its_file(tmp_path):
    t = table([llm("e1", 1)]).drop(["completion_token_ids"])
    pq.write_table(t, tmp_path / "bad.parquet")
    with pytest.raises(SchemaError, match=r"bad\.parquet: missing required column\(s\) "
                                          r"'completion_token_ids'"):
        read_spans(tmp_path)


def test_no_files_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no span Parquet files"):
        read_spans(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_spans(tmp_path / "nope")
