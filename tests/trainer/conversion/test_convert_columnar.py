"""The converter gives exactly the reference implementation's transitions and counts.

Random tables full of the cases that matter (merges that extend and that do not, equal start
times, duplicates, missing ids, empty completions, logprobs missing or of the wrong length,
missing turns, agents, tasks and episode ids, rewards of every scope, non-finite and missing
rewards, clock skew), under every configuration. Both must agree value for value, in the same
row order, and on every statistic.
"""

import math
import random

import pyarrow.parquet as pq
import pytest

from agl_bridge.trainer.conversion import ConvertConfig, convert, spans_to_transitions
from tests.factories import llm, reward, table
from tests.reference_converter import reference_spans_to_transitions

ORACLE = {"baseline": "group"}  # the reference's one baseline (batch: test_baselines.py)
CONFIGS = [
    ConvertConfig(**ORACLE),
    ConvertConfig(algorithm="lightning_rl", **ORACLE),
    ConvertConfig(alpha=0.5, gamma=0.9, **ORACLE),
    ConvertConfig(advantage_unit="rollout", scale_advantages=False, **ORACLE),
    ConvertConfig(merge_turn_calls=False, gamma=0.5, **ORACLE),
    ConvertConfig(missing_reward=0.25, advantage_unit="rollout", **ORACLE),
]


def tricky_rows(seed: int, episodes: int = 12) -> list[dict]:
    r = random.Random(seed)
    rows: list[dict] = []
    for e in range(episodes):
        ep = None if r.random() < 0.1 else f"e{e}"
        trace = f"T{e}"
        task = None if r.random() < 0.1 else f"t{e % 3}"
        t = r.randint(0, 5)
        for turn in range(r.randint(1, 3)):
            for agent in r.sample(["a", "b", None], r.randint(1, 3)):
                turn_value = None if r.random() < 0.2 else turn
                round_value = turn if turn_value is None and r.random() < 0.5 else None
                context = None
                for _ in range(r.randint(1, 4)):
                    t += r.choice((0, 1, 2))  # equal start times happen
                    if context is not None and r.random() < 0.7:
                        prompt = context + [r.randint(0, 9) for _ in range(r.randint(0, 3))]
                        u = r.random()
                        if u < 0.1:
                            prompt = context[:-1]  # shorter than the context
                        elif u < 0.2 and context:  # one token of the context differs
                            k = r.randrange(len(context))
                            prompt = prompt[:k] + [prompt[k] + 1] + prompt[k + 1:]
                    else:
                        prompt = [r.randint(0, 9) for _ in range(r.randint(1, 5))]
                    completion = [r.randint(0, 9) for _ in range(r.randint(0, 3))]
                    logprobs = [-r.random() for _ in completion]
                    u = r.random()
                    if u < 0.1:
                        logprobs = None
                    elif u < 0.15:
                        logprobs = logprobs + [-1.0]
                    row = llm(ep, t, task=task, agent=agent, prompt=prompt,
                              completion=completion, logprobs=logprobs, trace=trace,
                              turn=turn_value, candidate=r.choice((None, 0, 1)),
                              round=round_value)
                    if r.random() < 0.05:
                        row["prompt_token_ids"] = None
                    if r.random() < 0.05:
                        row["completion_token_ids"] = None
                    if r.random() < 0.05:
                        row["end_time_unix_nano"] = t - 1
                    rows.append(row)
                    if r.random() < 0.05:
                        rows.append(dict(row))  # exported twice
                    context = prompt + completion
        if r.random() < 0.85:
            rows.append(reward(ep, t + 1, round(r.random(), 3), trace=trace))
        if r.random() < 0.3:
            rows.append(reward(ep, t + 2, 0.5, scope="agent", agent="a", trace=trace))
        if r.random() < 0.3:
            rows.append(reward(ep, t + 2, 0.125, scope="turn", agent="b", turn=0, trace=trace))
        if r.random() < 0.1:
            rows.append(reward(ep, t + 3, math.inf, trace=trace))
        if r.random() < 0.1:
            rows.append(reward(ep, t + 3, 1.0, scope="agent", trace=trace))  # no agent
    r.shuffle(rows)
    return rows


def assert_same(rows, cfg):
    spans = table(rows)
    fast, fast_stats = spans_to_transitions(spans, cfg)
    ref, ref_stats = reference_spans_to_transitions(spans, cfg)
    assert fast.schema.equals(ref.schema)
    assert fast.to_pylist() == ref.to_pylist()
    for name in ("spans", "episodes", "llm_spans", "transitions", "groups",
                 "zero_variance_groups", "skipped", "notes", "per_agent_turn", "rewards",
                 "rejected_rewards"):
        assert getattr(fast_stats, name) == getattr(ref_stats, name), name
    assert fast_stats.summary() == ref_stats.summary()
    return fast


@pytest.mark.parametrize("cfg", CONFIGS, ids=range(len(CONFIGS)))
@pytest.mark.parametrize("seed", range(12))
def test_fast_path_equals_reference(seed, cfg):
    assert_same(tricky_rows(seed), cfg)


def test_fast_path_equals_reference_on_edge_tables():
    cfg = ConvertConfig(**ORACLE)
    assert assert_same([reward("e", 1, 1.0)], cfg).num_rows == 0  # no LLM call
    assert assert_same([llm("e", 1)], cfg).num_rows == 0  # no reward
    assert assert_same([llm("e", 1, prompt=None), reward("e", 2, 1.0)], cfg).num_rows == 0
    # a follow-up whose prompt is exactly the context: an empty observation
    out = assert_same([llm("e", 1, prompt=[1], completion=[2]),
                       llm("e", 2, prompt=[1, 2], completion=[3]), reward("e", 3, 1.0)], cfg)
    assert out.to_pylist()[0]["completion_mask"] == [1, 1]


def test_streamed_convert_equals_reference(tmp_path):
    """convert() streams episode-complete chunks: same transitions as the reference on the
    whole table (order aside: chunks are written as they complete)."""
    rows = []
    for seed in range(6):
        rows += [dict(r, episode_id=f"{seed}-{r['episode_id']}", trace_id=f"{seed}-{r['trace_id']}")
                 for r in tricky_rows(seed)]
    rows.sort(key=lambda r: r["start_time_unix_nano"])  # episodes interleave in the files
    (tmp_path / "spans").mkdir()
    for k in range(0, len(rows), 50):
        pq.write_table(table(rows[k:k + 50]), tmp_path / "spans" / f"{k:05d}.parquet",
                       row_group_size=16)
    stats = convert(tmp_path / "spans", tmp_path / "t.parquet", ConvertConfig(**ORACLE))
    ref, ref_stats = reference_spans_to_transitions(table(rows), ConvertConfig(**ORACLE))
    got = pq.read_table(tmp_path / "t.parquet")
    key = [("span_id", "ascending"), ("trace_id", "ascending")]
    assert got.sort_by(key).to_pylist() == ref.sort_by(key).to_pylist()
    assert stats.transitions == ref_stats.transitions
    assert stats.skipped == ref_stats.skipped and stats.notes == ref_stats.notes
    assert sorted(stats.rewards) == sorted(ref_stats.rewards)


def test_convert_streams_units_as_they_complete(tmp_path, monkeypatch):
    """Tasks local in time (as GRPO rollouts of one task run together): convert() streams,
    converting each task's episodes once they are read whole, and gives the reference's
    transitions; an unreadable file among them is counted and the rest converted."""
    from agl_bridge.trainer.conversion import engine

    streamed = []
    real = engine.convert_streaming
    monkeypatch.setattr(engine, "convert_streaming",
                        lambda *a, **k: streamed.append(1) or real(*a, **k))
    rows = []
    for seed in range(8):
        part = [dict(r, episode_id=r["episode_id"] and f"{seed}-{r['episode_id']}",
                     trace_id=f"{seed}-{r['trace_id']}",
                     task_id=r.get("task_id") and f"{seed}-{r['task_id']}")
                for r in tricky_rows(seed, episodes=6)]
        rows += sorted(part, key=lambda r: r["start_time_unix_nano"])
    (tmp_path / "spans").mkdir()
    for k in range(0, len(rows), 40):
        pq.write_table(table(rows[k:k + 40]), tmp_path / "spans" / f"{k:05d}.parquet",
                       row_group_size=16)
    (tmp_path / "spans" / "99999-truncated.parquet").write_bytes(
        (tmp_path / "spans" / "00000.parquet").read_bytes()[:100])
    seen = []
    stats = convert(tmp_path / "spans", tmp_path / "t.parquet", ConvertConfig(**ORACLE),
                    max_rows_in_memory=400,
                    progress=lambda done, total: seen.append((done, total)))
    assert streamed and len(seen) > 3 and seen[-1][0] == seen[-1][1]
    ref, ref_stats = reference_spans_to_transitions(table(rows), ConvertConfig(**ORACLE))
    got = pq.read_table(tmp_path / "t.parquet")
    key = [("span_id", "ascending"), ("trace_id", "ascending")]
    assert got.sort_by(key).to_pylist() == ref.sort_by(key).to_pylist()
    assert stats.transitions == ref_stats.transitions and stats.episodes == ref_stats.episodes
    assert stats.skipped == ref_stats.skipped
    assert stats.notes.pop("unreadable file skipped: 99999-truncated.parquet (ArrowInvalid)") == 1
    assert stats.notes == ref_stats.notes
    assert stats.groups == ref_stats.groups
    assert stats.zero_variance_groups == ref_stats.zero_variance_groups


def test_units_join_episodes_that_share_tasks():
    import pyarrow as pa

    from agl_bridge.trainer.conversion.streaming import units as _units

    episodes = pa.array(["e1", "e2", "e3", "e4", "e5", "e6"])
    pairs_e = [pa.array(["e1", "e2", "e2"]), pa.array(["e3", "e4", "e6"])]
    pairs_t = [pa.array(["A", "A", "B"]), pa.array(["B", "C", "A"])]
    unit = _units(episodes, pairs_e, pairs_t).tolist()
    assert unit[0] == unit[1] == unit[2] == unit[5]  # e1-A-e2-B-e3, e6-A
    assert len({unit[0], unit[3], unit[4]}) == 3  # e4 (task C) and e5 (no task) alone
    assert _units(episodes, [], []).tolist() == list(range(6))


def test_convert_never_imports_pandas(tmp_path):
    """pyarrow imports pandas (half a second, ~40 MiB) on ``pa.scalar``, ``pa.array`` and
    ``to_numpy``; the converter avoids them. A fresh process proves it, baselines included."""
    import subprocess
    import sys

    (tmp_path / "spans").mkdir()
    rows = tricky_rows(0) + tricky_rows(1)
    pq.write_table(table(rows), tmp_path / "spans" / "a.parquet")
    code = ("import sys\n"
            "from agl_bridge.trainer.conversion import ConvertConfig, convert\n"
            "for b in ('group', 'batch'):\n"
            f"    convert({str(tmp_path / 'spans')!r}, {str(tmp_path)!r} + f'/t-{{b}}.parquet',\n"
            "            ConvertConfig(baseline=b))\n"
            "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
