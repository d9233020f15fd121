"""What the span writer promises under faults (docs/reliability.md), each shown by a real fault:
``kill -9`` of a writer at every step of a rotation, a zero-code program killed while it runs,
a disk that fills mid-append, a log recovery cannot read, DuckDB reading while writers die.

Kills are real (SIGKILL of a subprocess). Where a kill must land at one exact step, the child
arms ``parquet_writer.crash_hook``, the writer's fault-injection point, or patches the one call
it must die in (so those tests fail on a writer without the hook for the right reason too)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from agl_bridge.otel import SpanParquetWriter
from agl_bridge.otel import parquet_writer as pw
from agl_bridge.otel.rows import build_row, rows_to_table
from agl_bridge.parquet_io import TMP_PREFIX, iter_parquet_files
from tests.paths import ROOT

STEPS = ("log-closed", "temp-written", "renamed", "log-deleted")
DAY_NS = 1_767_225_600 * 10**9  # 2026-01-01: every row in one known partition


def rows(prefix: str, n: int) -> list[dict]:
    trace_id = f"{int.from_bytes(prefix.encode()) + 1:032x}"
    return [build_row(
        trace_id=trace_id, span_id=f"{i + 1:016x}", parent_span_id=None, name=f"{prefix}{i}",
        kind="INTERNAL", start_time_unix_nano=DAY_NS + i, end_time_unix_nano=DAY_NS + i + 1,
        status_code="UNSET", status_message=None, attributes={"i": i},
        resource={"service.name": "svc"}) for i in range(n)]


def names_on_disk(directory: Path) -> list[str]:
    files = list(iter_parquet_files(directory))
    return sorted(n for f in files for n in pq.read_table(f, columns=["name"])["name"].to_pylist())


def duckdb_names(directory: Path) -> list[str]:
    """The README's query, as a user runs it."""
    return sorted(r[0] for r in duckdb.sql(
        f"SELECT name FROM read_parquet('{directory}/**/*.parquet', hive_partitioning=true)"
    ).fetchall())


def leftovers(directory: Path) -> list[str]:
    """Temporaries and logs: after a recovery there must be none."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.name.startswith(TMP_PREFIX) or p.suffix == ".arrows")


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def child_code(code: str) -> str:
    """A child script: ``rows`` from this file, the writer module as ``pw``, ``die()``, and
    ``die_after_one_row_group()`` (the next Parquet write is killed inside the file)."""
    return textwrap.dedent("""
        import os, signal, sys
        import pyarrow.parquet as pq
        from tests.otel.test_capture_reliability import rows
        from agl_bridge.otel import parquet_writer as pw
        def die(*_a, **_k):
            os.kill(os.getpid(), signal.SIGKILL)
        def die_after_one_row_group():
            write = pq.ParquetWriter.write_table
            def half(self, table, row_group_size=None):
                write(self, table.slice(0, 1), row_group_size=1)
                self.file_handle.flush() if self.file_handle else None
                die()
            pq.ParquetWriter.write_table = half
    """) + textwrap.dedent(code)


# the children import this file as ``tests.otel.test_capture_reliability``, from the repo root
CHILD_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def run_child(code: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", child_code(code), *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=CHILD_ENV)


# -- item 2: a kill at any step of a rotation, then recover: every row exactly once -----------
KILLED_AT_STEP = """
    directory, step = sys.argv[1], sys.argv[2]
    w = pw.SpanParquetWriter(directory, background_rotation=False)
    w.write_rows(rows("a", 5))
    w.flush()                                   # one complete file before the fault
    if step == "temp-half-written":             # killed inside the Parquet write itself
        die_after_one_row_group()
    else:
        pw.crash_hook = lambda name: die() if name == step else None
    w.write_rows(rows("b", 7))
    w.write_rows(rows("c", 3))
    w.flush()
"""


def test_the_rotation_steps_are_the_ones_tested():
    assert pw.ROTATION_STEPS == STEPS


@pytest.mark.parametrize("step", ("temp-half-written",) + STEPS)
def test_a_kill_at_each_rotation_step_then_recover_leaves_every_row_once(tmp_path, step):
    out = run_child(KILLED_AT_STEP, tmp_path, step)
    assert out.returncode == -signal.SIGKILL, out.stderr  # it died at that step
    expected = sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(7)]
                      + [f"c{i}" for i in range(3)])
    # before recovery, readers see whole files only: the first, plus the second once renamed
    before = duckdb_names(tmp_path)
    assert before == (expected if step in ("renamed", "log-deleted") else expected[:5])
    SpanParquetWriter.recover(tmp_path)
    assert names_on_disk(tmp_path) == expected  # exactly once: no duplicate, no loss
    assert duckdb_names(tmp_path) == expected
    assert leftovers(tmp_path) == []
    SpanParquetWriter.recover(tmp_path)  # again: nothing changes
    assert names_on_disk(tmp_path) == expected


def test_a_log_left_after_its_rename_is_not_recovered_twice(tmp_path):
    """The state a kill between the Parquet rename and the log's deletion leaves, made by hand:
    the rotated file and its log both on disk."""
    writer = SpanParquetWriter(tmp_path, background_rotation=False)
    writer.write_rows(rows("s", 4))
    (log,) = (tmp_path / "_wal").iterdir()
    saved = log.read_bytes()
    writer.flush()
    assert not log.exists() and names_on_disk(tmp_path) == ["s0", "s1", "s2", "s3"]
    log.write_bytes(saved)  # as if the process died just before deleting it
    SpanParquetWriter.recover(tmp_path, include_live=True)
    assert names_on_disk(tmp_path) == ["s0", "s1", "s2", "s3"]
    assert not log.exists()
    writer.close()


# -- item 3: DuckDB never reads temporaries; recover removes those of dead writers ------------
DIES_MID_WRITE = """
    directory, how = sys.argv[1], sys.argv[2]
    w = pw.SpanParquetWriter(directory, background_rotation=False)
    w.write_rows(rows("a", 3))
    w.flush()
    if how == "half-written":
        die_after_one_row_group()
    else:                                        # complete temporary, killed before the rename
        os.replace = die
    w.write_rows(rows("b", 2))
    w.flush()
"""


@pytest.mark.parametrize("how", ["half-written", "complete"])
def test_duckdb_glob_ignores_a_dead_writers_temporary_and_recover_removes_it(tmp_path, how):
    out = run_child(DIES_MID_WRITE, tmp_path, how)
    assert out.returncode == -signal.SIGKILL, out.stderr
    (tmp,) = [p for p in tmp_path.rglob(f"{TMP_PREFIX}*")]  # the dead writer's temporary
    assert duckdb_names(tmp_path) == ["a0", "a1", "a2"]  # it is not read
    SpanParquetWriter(tmp_path, background_rotation=False).close()  # start-up recovery
    assert not tmp.exists() and leftovers(tmp_path) == []
    assert duckdb_names(tmp_path) == ["a0", "a1", "a2", "b0", "b1"]


def test_duckdb_reads_while_a_rotation_is_between_its_temporary_and_its_rename(
        tmp_path, monkeypatch):
    writer = SpanParquetWriter(tmp_path, background_rotation=False)
    writer.write_rows(rows("a", 2))
    writer.flush()
    seen = []

    def read_mid_rotation(step):
        if step == "temp-written":
            assert any(p.name.startswith(TMP_PREFIX) for p in tmp_path.rglob("*"))
            seen.append(duckdb_names(tmp_path))

    monkeypatch.setattr(pw, "crash_hook", read_mid_rotation)
    writer.write_rows(rows("b", 2))
    writer.flush()
    assert seen == [["a0", "a1"]]  # the temporary was there and was not read
    writer.close()


def test_a_temporary_of_a_live_writer_is_left_alone(tmp_path):
    """Start-up recovery of a second writer must not delete what a live one is writing."""
    from agl_bridge.parquet_io import remove_stale_temps, temp_path

    mine = temp_path(tmp_path / "p" / "part-x.parquet")
    mine.parent.mkdir()
    mine.write_bytes(b"in progress")
    theirs = mine.with_name(mine.name.replace(f"-{os.getpid()}-", f"-{dead_pid()}-", 1))
    theirs.write_bytes(b"abandoned")
    assert not mine.name.endswith(".parquet")
    assert remove_stale_temps(tmp_path) == [theirs]
    assert mine.exists() and not theirs.exists()


# -- two writers on one directory ---------------------------------------------------------------
PAUSES_MID_ROTATION = """
    directory = sys.argv[1]
    w = pw.SpanParquetWriter(directory, background_rotation=False)
    w.write_rows(rows("a", 4))
    def pause(step):
        if step == "temp-written":
            print("paused", flush=True)
            sys.stdin.readline()
    pw.crash_hook = pause
    w.flush()
    w.close()
"""


def test_a_second_writer_starting_on_the_directory_leaves_a_live_writers_files_alone(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", child_code(PAUSES_MID_ROTATION), str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=CHILD_ENV)
    try:
        assert child.stdout.readline() == "paused\n"  # A: temporary written, log still there
        in_flight = leftovers(tmp_path)
        assert len(in_flight) == 2
        b = SpanParquetWriter(tmp_path, background_rotation=False)  # B: start-up recovery
        b.write_rows(rows("b", 3))
        b.close()
        assert leftovers(tmp_path) == in_flight  # A's log and temporary untouched
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0, child.stderr.read()
    finally:
        child.kill()
        child.wait()
    assert names_on_disk(tmp_path) == ["a0", "a1", "a2", "a3", "b0", "b1", "b2"]
    assert leftovers(tmp_path) == []


# -- disk full mid-append: the log stays readable past the failed batch -------------------------
FILLS_THE_DISK = """
    import resource
    directory = sys.argv[1]
    w = pw.SpanParquetWriter(directory, background_rotation=False)
    w.write_rows(rows("a", 3))
    (log,) = [p for p in os.scandir(os.path.join(directory, "_wal"))]
    # the file size limit stands in for a full disk: a write crossing it is cut short, then
    # fails (EFBIG), exactly as a write hitting ENOSPC
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(log.path) + 100,
                                               resource.RLIM_INFINITY))
    try:
        w.write_rows(rows("b", 500))
    except OSError as exc:
        print("failed:", exc.errno, flush=True)
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    w.write_rows(rows("c", 2))                   # acknowledged: must survive
    print("acknowledged", flush=True)
    die()
"""


def test_a_failed_append_does_not_cost_the_batches_acknowledged_after_it(tmp_path):
    out = run_child(FILLS_THE_DISK, tmp_path)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert out.stdout.split("\n")[:2] == ["failed: 27", "acknowledged"]
    SpanParquetWriter.recover(tmp_path)
    assert names_on_disk(tmp_path) == ["a0", "a1", "a2", "c0", "c1"]  # b was refused, not torn
    assert leftovers(tmp_path) == []


def disk_full(table, where, **kw):
    """Stands in for ``pq.write_table`` on a full disk: half a file, then ENOSPC."""
    where.write(b"PAR1 half")
    raise OSError(28, "No space left on device")


def disk_full_rotation(self, table, row_group_size=None):
    """The same for the writer's rotation, which writes row group by row group."""
    raise OSError(28, "No space left on device")


def test_a_failed_rotation_is_retried_by_the_writer_and_new_batches_go_on(tmp_path, monkeypatch):
    writer = SpanParquetWriter(tmp_path, background_rotation=False)
    writer.write_rows(rows("f", 2))
    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full_rotation)
    with pytest.raises(OSError, match="No space left"):
        writer.flush()
    writer.write_rows(rows("g", 1))  # accepted meanwhile, into a fresh log
    monkeypatch.undo()
    writer.rotate_old()  # what the background thread runs every few seconds
    assert names_on_disk(tmp_path) == ["f0", "f1"]  # no recovery, no restart needed
    writer.close()
    assert names_on_disk(tmp_path) == ["f0", "f1", "g0"] and leftovers(tmp_path) == []


# -- item 4: recover never deletes what it cannot read ------------------------------------------
def recover_cli(directory: Path) -> subprocess.CompletedProcess:
    """``agl-bridge recover`` as an unprivileged user would meet it. Root reads any file, so
    as root the command runs without the capabilities that bypass file permissions."""
    cmd = [str(Path(sys.executable).with_name("agl-bridge")), "recover", str(directory)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        assert setpriv, "running as root: setpriv (util-linux) is needed to drop DAC override"
        cmd = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def dead_writers_log(directory: Path, prefix: str, n: int, seq: int = 1) -> Path:
    """A log of ``n`` rows in ``directory/_wal`` as a writer that died would leave it."""
    src = SpanParquetWriter(directory / f"src-{prefix}", background_rotation=False)
    src.write_rows(rows(prefix, n))
    (log,) = (src.directory / "_wal").iterdir()
    dest = directory / "_wal" / f"{dead_pid()}-20260101T000000-{seq:06d}-aaaaaaaa.arrows"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(log.read_bytes())
    src.close()
    shutil.rmtree(src.directory)
    return dest


def test_an_unreadable_log_is_kept_and_reported_and_the_rest_recovered(tmp_path):
    readable = dead_writers_log(tmp_path, "r", 3, seq=1)
    unreadable = dead_writers_log(tmp_path, "u", 3, seq=2)
    unreadable.chmod(0)

    out = recover_cli(tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.startswith("recovered 3 row(s)")
    assert f"kept {unreadable}: cannot read it: Permission denied" in out.stderr
    assert unreadable.exists() and not readable.exists()  # never deleted
    assert names_on_disk(tmp_path) == ["r0", "r1", "r2"]
    unreadable.chmod(0o600)  # once someone fixes it, it recovers
    out = recover_cli(tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("recovered 3 row(s)"), out.stderr
    assert names_on_disk(tmp_path) == ["r0", "r1", "r2", "u0", "u1", "u2"]


def test_a_recovery_that_cannot_write_keeps_the_log_and_says_why(tmp_path, monkeypatch):
    from agl_bridge.otel.recovery import recover

    log = dead_writers_log(tmp_path, "s", 3)
    monkeypatch.setattr(pq, "write_table", disk_full)
    report = recover(tmp_path)
    assert report.problems == [(log, "OSError: [Errno 28] No space left on device")]
    assert log.exists() and leftovers(tmp_path) == ["_wal/" + log.name]  # no temporary either
    monkeypatch.undo()
    assert recover(tmp_path).rows == 3 and names_on_disk(tmp_path) == ["s0", "s1", "s2"]


def test_a_log_that_is_not_a_log_is_kept_and_an_empty_one_removed(tmp_path):
    from agl_bridge.otel.recovery import recover

    wal = tmp_path / "_wal"
    wal.mkdir(parents=True)
    garbage = wal / f"{dead_pid()}-x.arrows"
    garbage.write_bytes(b"definitely not arrow")
    empty = wal / f"{dead_pid()}-y.arrows"  # killed between creating the log and its schema
    empty.touch()
    report = recover(tmp_path)
    assert [p for p, _ in report.problems] == [garbage] and garbage.exists()
    assert "not an Arrow IPC stream" in report.problems[0][1]
    assert not empty.exists() and report.logs_empty == 1


# -- quarantine: batched into one file per writer per rotation interval -------------------------
def test_quarantine_records_share_one_owner_only_file_per_interval(tmp_path):
    writer = SpanParquetWriter(tmp_path, background_rotation=False)
    for i in range(200):  # as the receiver does: one call per bad request
        writer.quarantine([{"error": "bad", "i": i, "k": k} for k in range(1 + (i < 10))])
    files = list((tmp_path / "_quarantine").glob("*.jsonl"))
    assert len(files) == 1 and writer.rows_quarantined == 210
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    # durable as written, while the writer is still open: nothing waits in a buffer
    records = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert len(records) == 210 and records[-1] == {"error": "bad", "i": 199, "k": 0}
    writer.max_file_age_s = 0  # the interval is over: the next record starts a new file
    writer.rotate_old()
    writer.quarantine([{"error": "late"}])
    assert len(list((tmp_path / "_quarantine").glob("*.jsonl"))) == 2
    writer.close()


# -- collector outage: the local Parquet does not depend on the collector ----------------------
def test_a_collector_outage_costs_the_local_parquet_nothing(tmp_path):
    import socket

    with socket.socket() as sock:  # a port nothing listens on: connections are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
    env.update(AGL_BRIDGE_AUTO="1", AGL_BRIDGE_PARQUET_DIR=str(tmp_path),
               OTEL_TRACES_EXPORTER="both", OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
               OTEL_EXPORTER_OTLP_TIMEOUT="1")
    program = ("import agl_bridge\n"
               "for i in range(20):\n"
               "    with agl_bridge.episode(f'ep-{i}'), agl_bridge.agent('solver'):\n"
               "        pass\n"
               "print('done')\n")
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "done\n", out.stderr
    assert "Failed to export" in out.stderr  # the collector really was unreachable
    table = pq.read_table(next(iter_parquet_files(tmp_path)))
    assert sorted(set(table["episode_id"].to_pylist())) == sorted(f"ep-{i}" for i in range(20))
    assert table.num_rows == 40


# -- item 1: zero-code capture, killed: what ended before the bound is on disk ----------------
ZERO_CODE_AGENT = """
import sys, time
import agl_bridge

i = 0
while True:  # an episode ends, then the program says so: the parent knows what had finished
    with agl_bridge.episode(f"ep-{i:06d}"):
        with agl_bridge.agent("solver"):
            pass
    print(i, time.monotonic(), flush=True)
    i += 1
    time.sleep(0.025)
"""
# The SDK's default would export at 5 s and 10 s after start: kill at 8 s, and demand every
# episode that ended by 6 s. At 2 spans per 25 ms at most, fewer than 512 spans (its batch size)
# end in 5 s, so no full batch forces an export in between. The margin is ten times the bound:
# a process's first export also pays for pyarrow importing pandas (0.4 s of CPU, seconds on a
# loaded machine), and the test must not depend on the machine being quiet.
RUN_S = 8.0
MARGIN_S = 2.0


def test_zero_code_capture_killed_keeps_every_span_that_ended_before_the_bound(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}
    env.update(AGL_BRIDGE_AUTO="1", AGL_BRIDGE_PARQUET_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", ZERO_CODE_AGENT], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    ended: dict[int, float] = {}
    try:
        for line in proc.stdout:
            i, t = line.split()
            ended[int(i)] = float(t)
            if float(t) - ended[0] >= RUN_S:
                break
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    SpanParquetWriter.recover(tmp_path)
    on_disk = {(r["episode_id"], r["name"]) for f in iter_parquet_files(tmp_path)
               for r in pq.read_table(f, columns=["episode_id", "name"]).to_pylist()}
    finished = [i for i, t in ended.items() if t < killed_at - MARGIN_S]
    assert len(finished) > 20  # the program ran long enough for this to mean something
    missing = [i for i in finished
               if {(f"ep-{i:06d}", "agl_bridge.episode"), (f"ep-{i:06d}", "invoke_agent solver")}
               - on_disk]
    assert missing == []


def test_a_rotation_keeps_the_whole_batches_of_a_log_with_a_torn_tail(tmp_path, caplog):
    """An append whose cut-back failed leaves half a batch at the end of the writer's own log:
    rotation keeps the batches before it (as recovery would) instead of failing forever."""
    writer = SpanParquetWriter(tmp_path, background_rotation=False)
    writer.write_rows(rows("t", 3))
    (log,) = writer._logs.values()
    batch = rows_to_table(rows("x", 2)).to_batches()[0].serialize().to_pybytes()
    with open(log.path, "ab") as f:
        f.write(batch[: len(batch) // 2])
    writer.flush()
    assert names_on_disk(tmp_path) == ["t0", "t1", "t2"] and leftovers(tmp_path) == []
    assert "ends in a torn batch" in caplog.text
    writer.close()
