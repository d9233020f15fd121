"""Conversion in parallel: processes (``convert_parallel``, ``--workers``) and machines
(``part=``, ``--part I/N``) give the rows of the one-process run, row for row."""

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agl_bridge.trainer.conversion import ConvertConfig, convert
from agl_bridge.trainer.conversion.parallel import convert_parallel
from agl_bridge.trainer.conversion.partition import parse_part, rows_in_part
from agl_bridge.trainer.training.data import read_transitions
from tests.factories import llm, reward, table


@pytest.fixture(scope="module")
def spans_dir(tmp_path_factory) -> Path:
    """40 tasks x 3 episodes of 2 agents x 2 turns, plus 10 episodes without a task; episodes
    of neighbouring tasks interleaved in time, spread over 3 files of 64-row groups, so a
    task's rows are in several row groups, some in two files (a streaming part is a range of
    row groups owning the tasks that begin in it)."""
    rng = random.Random(7)
    rows = []
    episodes = [(f"e{t}-{k}", f"task{t}") for t in range(40) for k in range(3)]
    episodes += [(f"solo{k}", None) for k in range(10)]
    # a task's rollouts run about together, as GRPO rollouts do: order by task, +-3 tasks
    episodes.sort(key=lambda e: (int(e[1][4:]) if e[1] else rng.randrange(40))
                  + rng.uniform(-3, 3))
    for n, (ep, task) in enumerate(episodes):
        t0 = n * 3
        for turn in range(2):
            for agent in ("solver", "checker"):
                rows.append(llm(ep, t0 + rng.randrange(100), task=task, agent=agent, turn=turn,
                                trace=f"T{ep}", prompt=[257, rng.randrange(40, 200), 258],
                                completion=[rng.randrange(60, 250), 258]))
        rows.append(reward(ep, t0 + 150, round(rng.random(), 3), trace=f"T{ep}"))
    rows.sort(key=lambda r: r["start_time_unix_nano"])
    out = tmp_path_factory.mktemp("spans")
    third = len(rows) // 3
    for i in range(3):
        pq.write_table(table(rows[i * third:(i + 1) * third if i < 2 else None]),
                       out / f"part-{i}.parquet", row_group_size=64)
    return out


def _sorted(t: pa.Table) -> list[dict]:
    return sorted(t.to_pylist(), key=lambda r: (r["episode_id"], r["agent_name"],
                                               r["turn_index"], r["span_id"]))


@pytest.mark.parametrize("max_rows", [100_000, 40], ids=["streaming", "spilled"])
@pytest.mark.parametrize("baseline", ["group", "batch"])
def test_parallel_conversion_equals_one_process_row_for_row(spans_dir, tmp_path, max_rows,
                                                            baseline):
    cfg = ConvertConfig(baseline=baseline)
    one = convert(spans_dir, tmp_path / "one.parquet", cfg, max_rows_in_memory=max_rows)
    assert one.transitions == 130 * 4 and one.groups > 0
    seen = []
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "part-00000-of-00003.parquet").write_text("an earlier run's")
    two = convert_parallel(spans_dir, tmp_path / "two", cfg, workers=2,
                           max_rows_in_memory=max_rows, on_part=lambda i, s: seen.append(i))
    assert sorted(seen) == [0, 1]
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [
        "part-00000-of-00002.parquet", "part-00001-of-00002.parquet"]
    a = pq.read_table(tmp_path / "one.parquet")
    b = read_transitions(tmp_path / "two")
    assert a.schema.equals(b.schema, check_metadata=True)
    assert _sorted(a) == _sorted(b)  # every column, advantages included
    assert (two.transitions, two.spans, two.episodes, two.llm_spans, two.files, two.groups) == (
        one.transitions, one.spans, one.episodes, one.llm_spans, one.files, one.groups)
    assert sorted(two.rewards) == sorted(one.rewards)
    assert not list(tmp_path.glob(".two*"))  # nothing left beside it
    (tmp_path / "two" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not only conversion parts"):
        convert_parallel(spans_dir, tmp_path / "two", cfg, workers=2)
    assert (tmp_path / "two" / "notes.txt").read_text() == "mine"  # nothing replaced


def test_parts_on_machines_together_hold_the_whole_and_train_as_a_directory(spans_dir,
                                                                           tmp_path):
    group = ConvertConfig(baseline="group")  # a part alone: no batch fallback (below)
    one = convert(spans_dir, tmp_path / "one.parquet", group)
    parts = tmp_path / "parts"
    stats = [convert(spans_dir, parts / f"{i}.parquet", group, part=(i, 3)) for i in range(3)]
    assert [s.files for s in stats] == [3, 0, 0]  # files counted once, by part 0
    assert all(s.transitions > 0 for s in stats)
    assert sum(s.transitions for s in stats) == one.transitions
    tables = [pq.read_table(parts / f"{i}.parquet") for i in range(3)]
    tasks = [set(t["task_id"].to_pylist()) - {None} for t in tables]
    assert not (tasks[0] & tasks[1]) and not (tasks[1] & tasks[2])  # whole tasks per part
    assert _sorted(pa.concat_tables(tables)) == _sorted(pq.read_table(tmp_path / "one.parquet"))

    assert read_transitions(parts).num_rows == one.transitions

    # refused before anything is read when every transition would need it ...
    with pytest.raises(ValueError, match="batch and key: baselines"):
        convert(tmp_path / "no-such-spans", tmp_path / "p.parquet",
                ConvertConfig(baseline="batch"), part=(0, 2))
    # ... and after converting when some fell back to it (the episodes without a task)
    with pytest.raises(ValueError, match=r"batch and key: baselines.*--baseline group"):
        convert(spans_dir, tmp_path / "p.parquet", part=(0, 2))  # the default: group,batch
    assert not (tmp_path / "p.parquet").exists()


def test_part_arguments_are_checked():
    assert parse_part("1/4") == (1, 4)
    for bad in ("4/4", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ValueError, match="part"):
            parse_part(bad)
    t = table([llm("e1", 1, task="x"), llm("e2", 2, task="y")])
    assert rows_in_part(t, (0, 1)).num_rows == 2
    assert rows_in_part(t, (0, 2)).num_rows + rows_in_part(t, (1, 2)).num_rows == 2


def test_cli_workers(spans_dir, tmp_path):
    exe = Path(sys.executable).with_name("agl-bridge")
    out = subprocess.run([str(exe), "convert", str(spans_dir), str(tmp_path / "t"),
                          "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "520 transitions" in out.stdout and "part 1 of 2 done" in out.stderr
    assert "2 parts" in out.stdout and read_transitions(tmp_path / "t").num_rows == 520
    bad = subprocess.run([str(exe), "convert", str(spans_dir), str(tmp_path / "u.parquet"),
                          "--workers", "2", "--part", "0/2"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "exclusive" in bad.stderr


def test_a_directory_of_parts_trains_like_one_file(spans_dir, tiny, tmp_path):
    import agl_bridge

    convert_parallel(spans_dir, tmp_path / "parts", workers=2)
    run = agl_bridge.train_from_traces(tmp_path / "parts", tiny, output_dir=tmp_path / "run",
                                       policy="per_agent_lora", max_steps=2,
                                       per_device_train_batch_size=4, progress=False)
    assert run.conversion is None  # read as transitions, not converted again
    assert sorted(run.adapters) == ["checker", "solver"] and run.steps == 2


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_conversion_killed_in_its_switch_is_put_back_by_the_next(spans_dir, tmp_path):
    """kill -9 between moving the previous output aside and renaming the new one into place
    leaves no ``out``: the next run restores the previous one first, then replaces it; parts in
    progress of dead runs are removed, a live run's are not touched."""
    from agl_bridge.trainer.conversion.parallel import recover

    out = tmp_path / "t"
    convert_parallel(str(spans_dir), out, workers=2)
    before = _sorted(read_transitions(out))
    dead = _dead_pid()
    aside = tmp_path / f".t.old-{dead}-0badc0de"
    out.rename(aside)  # what the kill left: the previous output aside, the new half-written
    (tmp_path / f".t.tmp-{dead}-12345678").mkdir()
    (tmp_path / f".t.tmp-{dead}-12345678" / "part-00000-of-00002.parquet").write_bytes(b"PAR1")
    live = tmp_path / f".t.tmp-{os.getpid()}-87654321"
    live.mkdir()
    assert sorted(recover(out)) == [f"removed .t.tmp-{dead}-12345678",
                                    f"restored t from .t.old-{dead}-0badc0de"]
    assert _sorted(read_transitions(out)) == before and live.exists()
    live.rmdir()
    convert_parallel(str(spans_dir), out, workers=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_kill_9_while_parts_convert_leaves_the_previous_output(spans_dir, tmp_path):
    exe = Path(sys.executable).with_name("agl-bridge")
    out = tmp_path / "t"
    convert_parallel(str(spans_dir), out, workers=2)
    before = _sorted(read_transitions(out))
    proc = subprocess.Popen([str(exe), "convert", str(spans_dir), str(out), "--workers", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".t.tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    assert list(tmp_path.glob(".t.tmp-*")), "the conversion ended before it could be killed"
    assert _sorted(read_transitions(out)) == before  # the previous output, whole
    convert_parallel(str(spans_dir), out, workers=2)
    assert _sorted(read_transitions(out)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]
