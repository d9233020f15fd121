"""Crash recovery of a span directory: what dead writers left becomes Parquet, exactly once.

Run by every new ``SpanParquetWriter`` on its directory and by ``agl-bridge recover DIR``.
For each write-ahead log of a dead process (by pid; live ones are left alone):

* its Parquet file already exists (the writer was killed after the rename of its rotation):
  the log is deleted, nothing is written, so no row appears twice;
* otherwise every whole batch becomes that same file (temporary, fsync, rename), then the log
  is deleted. A torn last batch is the batch being written at the kill: never acknowledged;
* the log cannot be read (permissions, I/O error, not a log) or its file cannot be written
  (disk full): the log is kept and reported as a problem, with the reason. Nothing that
  could not be read is ever deleted, and the other logs are still recovered.

Temporaries of dead writers (``parquet_io.remove_stale_temps``) are deleted too: they are
never part of the data, but they fill the disk.

Running it twice, or two of it at once, is safe: each step can be repeated, names are fixed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from agl_bridge.otel.wal import (
    LOG_SUFFIX,
    WAL_DIR,
    UnreadableLog,
    log_pid,
    parquet_name,
    read_log,
)
from agl_bridge.parquet_io import pid_alive, remove_stale_temps, write_table_atomic
from agl_bridge.schema import SPAN_SCHEMA

logger = logging.getLogger(__name__)


@dataclass
class Recovery:
    """What one recovery did. ``problems``: logs kept on disk because they could not be
    recovered, each with the reason; a caller that reports to a person must show them."""

    rows: int = 0
    files: list[Path] = field(default_factory=list)
    logs_already_published: int = 0  # Parquet file existed: only the log was left to delete
    logs_empty: int = 0  # no whole batch: the writer died before acknowledging anything
    temps_removed: list[Path] = field(default_factory=list)
    problems: list[tuple[Path, str]] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"recovered {self.rows} row(s) into {len(self.files)} file(s)"]
        if self.logs_already_published:
            parts.append(f"{self.logs_already_published} log(s) already in Parquet (deleted)")
        if self.logs_empty:
            parts.append(f"{self.logs_empty} empty log(s) deleted")
        if self.temps_removed:
            parts.append(f"{len(self.temps_removed)} temporary file(s) of dead writers removed")
        if self.problems:
            parts.append(f"{len(self.problems)} log(s) KEPT, not recovered")
        return "; ".join(parts)


def recover(directory: str | os.PathLike[str], *, row_group_rows: int = 16_384,
            include_live: bool = False) -> Recovery:
    """Recover ``directory`` (see the module docstring). Logs of live processes (this one
    included) are left alone unless ``include_live``: use it only when no writer is at work."""
    directory = Path(directory)
    report = Recovery(temps_removed=remove_stale_temps(directory))
    wal = directory / WAL_DIR
    for path in sorted(wal.glob(f"*{LOG_SUFFIX}")) if wal.is_dir() else []:
        if not include_live and pid_alive(log_pid(path)):
            continue
        try:
            _recover_log(path, directory, row_group_rows, report)
        except UnreadableLog as exc:
            report.problems.append((path, str(exc)))
        except OSError as exc:  # writing its Parquet file or deleting it failed
            report.problems.append((path, f"{type(exc).__name__}: {exc}"))
    for path, reason in report.problems:
        logger.error("agl_bridge: write-ahead log %s kept, not recovered: %s", path, reason)
    return report


def _recover_log(path: Path, directory: Path, row_group_rows: int, report: Recovery) -> None:
    try:
        contents = read_log(path)
    except UnreadableLog:
        if not path.exists():  # another recovery finished it meanwhile
            return
        raise
    if contents.table is None or contents.partition is None:
        path.unlink(missing_ok=True)
        report.logs_empty += 1
        return
    if contents.cut:
        logger.info("agl_bridge: %s ends in a torn batch (%s)", path, contents.cut)
    target = directory / contents.partition / parquet_name(path)
    if target.exists():
        report.logs_already_published += 1
    else:
        table = contents.table.replace_schema_metadata(SPAN_SCHEMA.metadata)
        write_table_atomic(table, target, row_group_size=row_group_rows)
        report.rows += table.num_rows
        report.files.append(target)
    path.unlink(missing_ok=True)
