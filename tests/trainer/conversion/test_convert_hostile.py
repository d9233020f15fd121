"""The converter on hostile input: huge rewards, wrong column types, odd sources. Bad input is
named (file, column) and skipped; everything else is converted."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agl_bridge.schema import SPAN_SCHEMA
from agl_bridge.trainer.conversion import ConvertConfig, convert, reasons, spans_to_transitions
from tests.factories import llm, reward, table


@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("huge", [1e200, 1e308, -1.7976931348623157e308])
def test_huge_finite_rewards_give_finite_advantages(huge, scale):
    rows = []
    for k, value in enumerate([huge, 0.0, -huge / 2, 1.0]):
        rows += [llm(f"e{k}", 1, task="t", prompt=[k]), reward(f"e{k}", 2, value)]
    out, stats = spans_to_transitions(table(rows), ConvertConfig(scale_advantages=scale))
    advantages = out["advantage"].to_pylist()
    assert out.num_rows == 4 and all(math.isfinite(a) for a in advantages)
    assert stats.groups == 1 and stats.zero_variance_groups == 0
    best = max(range(4), key=lambda i: out["reward"][i].as_py())
    assert advantages[best] == max(advantages) > 0  # the order of rewards is kept
    # rollout unit: per-episode means of huge values too
    out_r, _ = spans_to_transitions(table(rows), ConvertConfig(advantage_unit="rollout",
                                                                scale_advantages=scale))
    assert all(math.isfinite(a) for a in out_r["advantage"].to_pylist())


def test_a_reward_sum_that_overflows_is_skipped_and_named():
    rows = [llm("e1", 1, task="t", agent="a"), reward("e1", 2, 1.7e308),
            reward("e1", 3, 1.7e308, scope="agent", agent="a"),  # team + local = inf
            llm("e2", 1, task="t", agent="a", prompt=[5]), reward("e2", 2, 1.0)]
    out, stats = spans_to_transitions(table(rows))
    assert out["episode_id"].to_pylist() == ["e2"]
    assert stats.skipped == {reasons.REWARD_OVERFLOW: 1}
    assert all(math.isfinite(r) for r in stats.rewards)


def test_wrong_column_types_skip_that_file_by_name_and_convert_the_rest(tmp_path, capsys):
    from agl_bridge.cli import main

    (tmp_path / "spans").mkdir()
    pq.write_table(table([llm("e1", 1), reward("e1", 2, 1.0)]), tmp_path / "spans" / "good.parquet")
    bad = table([llm("e2", 1), reward("e2", 2, 1.0)])
    bad = bad.set_column(bad.schema.get_field_index("episode_id"), "episode_id",
                         pa.array([7, 7], pa.int64()))
    pq.write_table(bad, tmp_path / "spans" / "bad-episode.parquet")
    floats = table([llm("e3", 1), reward("e3", 2, 1.0)])
    floats = floats.set_column(floats.schema.get_field_index("completion_token_ids"),
                               "completion_token_ids", pa.array([[3.5, 4.0], None],
                                                                pa.list_(pa.float64())))
    pq.write_table(floats, tmp_path / "spans" / "bad-ids.parquet")
    wide = table([llm("e4", 1), reward("e4", 2, 1.0)])  # int64 ids: read as int32
    wide = wide.set_column(wide.schema.get_field_index("prompt_token_ids"), "prompt_token_ids",
                           pa.array([[1, 2], None], pa.list_(pa.int64())))
    pq.write_table(wide, tmp_path / "spans" / "wide-ids.parquet")
    for path in (tmp_path / "spans", [tmp_path / "spans"]):
        for limit in (100_000, 3):  # the streaming route and the spilled one
            stats = convert(path, tmp_path / "t.parquet", max_rows_in_memory=limit)
            got = pq.read_table(tmp_path / "t.parquet")
            assert sorted(got["episode_id"].to_pylist()) == ["e1", "e4"], limit
            assert stats.notes[reasons.unreadable_file(
                "bad-episode.parquet", "column 'episode_id' is int64, expected string")] == 1
            assert stats.notes[reasons.unreadable_file(
                "bad-ids.parquet", "column 'completion_token_ids' is list<element: double>, "
                "expected list<element: int32 not null>")] == 1
    assert main(["convert", str(tmp_path / "spans"), str(tmp_path / "cli.parquet")]) == 0
    out = capsys.readouterr().out
    assert "bad-episode.parquet (column 'episode_id' is int64, expected string)" in out


def test_ids_that_do_not_fit_int32_make_the_file_unreadable_not_the_run(tmp_path):
    pq.write_table(table([llm("e1", 1), reward("e1", 2, 1.0)]), tmp_path / "good.parquet")
    big = table([llm("e2", 1), reward("e2", 2, 1.0)])
    big = big.set_column(big.schema.get_field_index("prompt_token_ids"), "prompt_token_ids",
                         pa.array([[2**40], None], pa.list_(pa.int64())))
    pq.write_table(big, tmp_path / "big.parquet")
    stats = convert(tmp_path, tmp_path / "out" / "t.parquet")
    assert pq.read_table(tmp_path / "out" / "t.parquet")["episode_id"].to_pylist() == ["e1"]
    assert stats.notes[reasons.unreadable_file("big.parquet", "ArrowInvalid")] == 1


def test_a_directory_of_collector_json_files_converts(tmp_path):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agl_bridge import semconv as sc
    from tests.otlp_helpers import otlp_json

    memory, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    scope = {sc.EPISODE_ID: "e1", sc.TASK_ID: "t", sc.GEN_AI_AGENT_NAME: "a", sc.TURN_INDEX: 0}
    tracer.start_span("chat m", attributes={**scope, sc.GEN_AI_OPERATION_NAME: "chat",
                                            sc.PROMPT_TOKEN_IDS: [1], sc.COMPLETION_TOKEN_IDS: [2]}
                      ).end()
    tracer.start_span(sc.SPAN_REWARD, attributes={**scope, sc.REWARD_VALUE: 0.5}).end()
    (tmp_path / "collector").mkdir()
    (tmp_path / "collector" / "traces.jsonl").write_text(
        json.dumps(otlp_json(list(memory.get_finished_spans()))) + "\n")
    stats = convert(tmp_path / "collector", tmp_path / "t.parquet")
    assert stats.transitions == 1
    assert pq.read_table(tmp_path / "t.parquet")["reward"].to_pylist() == [0.5]


def test_an_empty_table_of_the_span_schema_converts_to_nothing():
    out, stats = spans_to_transitions(SPAN_SCHEMA.empty_table())
    assert out.num_rows == 0 and stats.spans == 0 and stats.transitions == 0


def test_odd_files_in_a_span_directory_are_skipped_by_name_and_the_rest_converted(tmp_path):
    """Issue 30.7: a FIFO named x.parquet hung convert; a Parquet file without the required
    columns or a link that loops stopped it with nothing converted. Each is skipped and named."""
    import os
    import time

    spans = tmp_path / "spans"
    spans.mkdir()
    pq.write_table(table([llm("e1", 1), reward("e1", 2, 1.0)]), spans / "good.parquet")
    os.mkfifo(spans / "fifo.parquet")
    (spans / "zero.parquet").symlink_to("/dev/zero")
    (spans / "loop.parquet").symlink_to("loop.parquet")
    (spans / "broken.parquet").symlink_to("gone.parquet")
    (spans / "text.parquet").write_text("not parquet")
    pq.write_table(pa.table({"x": [1]}), spans / "other.parquet")
    (spans / "up").symlink_to("..")  # a directory loop
    t0 = time.monotonic()
    stats = convert(spans, tmp_path / "t.parquet")
    assert time.monotonic() - t0 < 30
    assert stats.transitions == 1 and stats.files == 1
    skipped = {k for k in stats.notes if k.startswith("unreadable file skipped")}
    for name in ("fifo", "zero", "loop", "broken"):
        assert any(f"{name}.parquet (not a regular file)" in k for k in skipped), name
    assert any("text.parquet (ArrowInvalid)" in k for k in skipped)
    assert any("other.parquet (missing required column(s)" in k for k in skipped)
    assert len(skipped) == 6
    with pytest.raises(FileNotFoundError, match=r"fifo\.parquet: not a regular file"):
        convert(spans / "fifo.parquet", tmp_path / "u.parquet")
