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
from agl_bridge.otel.rows import build_row
from agl_bridge.parquet_io import TMP_PREFIX, iter_parquet_files

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
    """A child script: ``rows`` from this file, the writer module as ``pw``, and ``die()``."""
    return textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_capture_reliability import rows
        from agl_bridge.otel import parquet_writer as pw
        def die(*_a, **_k):
            os.kill(os.getpid(), signal.SIGKILL)
    """) + textwrap.dedent(code)


def run_child(code: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", child_code(code), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


# -- item 3: DuckDB never reads temporaries; recover removes those of dead writers ------------
DIES_MID_WRITE = """
    directory, how = sys.argv[1], sys.argv[2]
    w = pw.SpanParquetWriter(directory, background_rotation=False)
    w.write_rows(rows("a", 3))
    w.flush()
    if how == "half-written":
        import pyarrow.parquet as pq
        def half(table, where, **kw):
            where.write(b"PAR1" + b"x" * 500)
            where.flush()
            die()
        pq.write_table = half
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
