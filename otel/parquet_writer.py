"""Durable, rotating, hive-partitioned Parquet sink for span rows.

Two promises pull against each other: files should be large (a few per minute, row groups
sized for scans), yet a ``kill -9`` of the producer must lose at most the batch being written,
and no reader may ever see a partial file. A Parquet file is unreadable until its footer is
written, so batches cannot be appended to one durably. Hence a write-ahead log (``wal.py``):

* each batch is appended to a per-partition Arrow IPC stream under ``_wal/`` and fsynced before
  ``write_rows`` returns (an append that fails is cut back, so the log stays readable);
* when a partition's log reaches ``max_file_rows`` / ``max_file_bytes`` / ``max_file_age_s``, it
  is rotated: closed, its batches written to a temporary, fsynced, renamed to the Parquet name
  fixed by the log's own name, the directory fsynced, and only then the log deleted;
* logs left by a dead process are finished by ``recovery.recover`` (run by every new writer on
  the same directory, and by ``agl-bridge recover``): a kill at any step of a rotation leaves
  every row in exactly one Parquet file after recovery, because the name tells recovery whether
  the rename already happened.

A rotation that fails (disk full) keeps its closed log and is retried by the background thread
and at ``flush``/``close``; whatever is still pending when the process dies is recovered.

Layout: ``<dir>/date=YYYY-MM-DD/service=<name>/part-<utc>-<pid>-<seq>-<rand>.parquet``
(hive-style, so pyarrow, pandas and DuckDB read the partitions with no help from us), UTC date
of the span start. Temporaries end in ``.tmp`` (``parquet_io``), so ``**/*.parquet`` globs never
see them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from agl_bridge.otel import recovery as _recovery
from agl_bridge.otel.rows import partition_of, rows_to_table
from agl_bridge.otel.wal import (
    WAL_DIR,
    LogFile,
    append_durably,
    iter_log,
    new_log_name,
    parquet_name,
)
from agl_bridge.parquet_io import publish, write_temp_batches
from agl_bridge.schema import SPAN_SCHEMA

logger = logging.getLogger(__name__)

QUARANTINE_DIR = "_quarantine"

#: Rows per Parquet row group of a rotated file. A rotation holds one row group of Arrow data
#: and its encoding buffers in memory (about 5 MiB for 2,048 chat spans of a few hundred token
#: ids), in the user's process. Readers that want larger groups can compact the files offline.
ROW_GROUP_ROWS = 2_048

#: The steps of a rotation, in order. After each one ``crash_hook`` (if set) is called with
#: its name: a fault-injection point, so tests can kill a writer at every step.
ROTATION_STEPS = ("log-closed", "temp-written", "renamed", "log-deleted")
crash_hook: Callable[[str], None] | None = None


def _step(name: str) -> None:
    if crash_hook is not None:
        crash_hook(name)


def _partition(row: dict[str, Any]) -> str:
    return partition_of(row.get("start_time_unix_nano"), row.get("service_name"))


@dataclass(eq=False)
class _Log:
    """One partition's write-ahead log. Its batches live on disk only: rotation reads the
    log back batch by batch, so memory holds one row group, not the file."""

    file: LogFile
    opened: float = field(default_factory=time.monotonic)
    rows: int = 0
    failures: int = 0  # failed rotations (the first is logged with its traceback)

    @property
    def partition(self) -> str:
        return self.file.partition

    @property
    def path(self) -> Path:
        return self.file.path


@dataclass
class _Quarantine:
    path: Path
    fd: int
    opened: float = field(default_factory=time.monotonic)
    size: int = 0


class SpanParquetWriter:
    """Thread-safe. ``write_rows`` is durable on return; ``close`` turns every log into Parquet."""

    def __init__(self, directory: str | os.PathLike[str], *, max_file_rows: int = 100_000,
                 max_file_bytes: int = 64 * 2**20, max_file_age_s: float = 60.0,
                 row_group_rows: int = ROW_GROUP_ROWS, recover: bool = True,
                 background_rotation: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / WAL_DIR).mkdir(exist_ok=True)
        self.max_file_rows = max_file_rows
        self.max_file_bytes = max_file_bytes
        self.max_file_age_s = max_file_age_s
        self.row_group_rows = row_group_rows
        self._logs: dict[str, _Log] = {}
        self._pending: list[_Log] = []  # closed logs whose rotation has not finished
        self._quarantine: _Quarantine | None = None
        self._lock = threading.Lock()
        self._seq = 0
        self._closed = False
        self.files_written = 0
        self.rows_written = 0
        self.rows_quarantined = 0
        self.recovery: _recovery.Recovery | None = None  # what start-up recovery did
        self.recovered_rows = 0
        if recover:
            self.recovery = _recovery.recover(self.directory, row_group_rows=row_group_rows)
            self.recovered_rows = self.recovery.rows
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        if background_rotation and max_file_age_s > 0:
            self._timer = threading.Thread(target=self._rotate_loop, daemon=True,
                                           name="agl-bridge-parquet-rotation")
            self._timer.start()

    # -- writing ----------------------------------------------------------------------------
    def write_rows(self, rows: Sequence[dict[str, Any]]) -> None:
        by_partition: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_partition.setdefault(_partition(row), []).append(row)
        self.write_tables({p: rows_to_table(r) for p, r in by_partition.items()})

    def write_tables(self, tables: dict[str, pa.Table]) -> None:
        """Append Arrow tables of ``SPAN_SCHEMA`` rows, keyed by partition (``rows.partition_of``;
        ``span_columns.spans_to_tables`` makes them): durable on return, like ``write_rows``."""
        if not tables:
            return
        with self._lock:
            if self._closed:
                raise RuntimeError(f"writer for {self.directory} is closed")
            for partition, table in tables.items():
                if not table.num_rows:
                    continue
                log = self._logs.get(partition) or self._open(partition)
                try:
                    log.file.append(table)
                except BaseException:
                    # cut back to its last whole batch; append to a fresh log from now on
                    self._seal(log)
                    raise
                log.rows += table.num_rows
                if log.rows >= self.max_file_rows or log.file.size >= self.max_file_bytes:
                    self._try_rotate(log)

    def _open(self, partition: str) -> _Log:
        self._seq += 1
        path = self.directory / WAL_DIR / new_log_name(self._seq)
        log = _Log(LogFile(path, partition, SPAN_SCHEMA))
        self._logs[partition] = log
        return log

    def _seal(self, log: _Log) -> None:
        """Stop appending to ``log``; it waits in ``_pending`` for rotation. Caller holds the
        lock."""
        if self._logs.get(log.partition) is log:
            del self._logs[log.partition]
        log.file.close()
        if log not in self._pending:
            self._pending.append(log)

    def _rotate(self, log: _Log) -> None:
        """Log -> Parquet file, one step at a time (``ROTATION_STEPS``). Caller holds the lock.
        Every step can be repeated: on failure the closed log stays pending (retried, and
        recovered after a crash), and a retry skips the write when the file already exists."""
        self._seal(log)
        _step("log-closed")
        target = self.directory / log.partition / parquet_name(log.path)
        if not target.exists():
            if log.path.exists():
                # batch by batch: memory holds one row group, not the log
                tmp, rows = write_temp_batches(iter_log(log.path, SPAN_SCHEMA), SPAN_SCHEMA,
                                               target, row_group_size=self.row_group_rows)
                if rows:
                    _step("temp-written")
                    publish(tmp, target)  # rename, then fsync the directory
                    _step("renamed")
                    self.files_written += 1
                    self.rows_written += rows
                else:
                    tmp.unlink(missing_ok=True)
            # else: ``recover(include_live=True)`` finished it already
        log.path.unlink(missing_ok=True)
        self._pending.remove(log)
        _step("log-deleted")

    def _try_rotate(self, log: _Log) -> None:
        try:
            self._rotate(log)
        except Exception as exc:  # the batches are durable in the log: retried, or recovered
            log.failures += 1
            if log.failures == 1:
                logger.exception("agl_bridge: rotating %s failed; will retry", log.path)
            else:
                logger.debug("agl_bridge: rotating %s failed again: %s", log.path, exc)

    def _rotate_loop(self) -> None:
        period = max(0.05, min(self.max_file_age_s / 2, 5.0))
        while not self._stop.wait(period):
            self.rotate_old()

    def rotate_old(self) -> None:
        """Rotate logs older than ``max_file_age_s`` and retry failed rotations (called by the
        background thread)."""
        now = time.monotonic()
        with self._lock:
            for log in list(self._pending):
                self._try_rotate(log)
            for log in list(self._logs.values()):
                if now - log.opened >= self.max_file_age_s:
                    self._try_rotate(log)
            q = self._quarantine
            if q is not None and now - q.opened >= self.max_file_age_s:
                self._close_quarantine()

    def flush(self) -> None:
        """Turn every log into a Parquet file now. Raises if one cannot be (its log is kept
        and retried)."""
        with self._lock:
            errors = []
            for log in [*self._pending, *self._logs.values()]:
                try:
                    self._rotate(log)
                except Exception as exc:
                    errors.append(exc)
            if errors:
                raise errors[0]

    def close(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=10)
        try:
            self.flush()
        finally:
            with self._lock:
                self._closed = True
                self._close_quarantine()

    # -- bad input ----------------------------------------------------------------------------
    def quarantine(self, records: Sequence[dict[str, Any]]) -> Path:
        """Keep what could not become a row and count it: JSON lines appended (and fsynced)
        to one owner-only file per writer per ``max_file_age_s``, not one file per call."""
        data = "".join(json.dumps(r, default=repr) + "\n" for r in records).encode()
        with self._lock:
            q = self._quarantine or self._open_quarantine()
            q.size = append_durably(q.fd, q.size, [data])
            self.rows_quarantined += len(records)
        logger.warning("agl_bridge: quarantined %d malformed span(s) in %s", len(records), q.path)
        return q.path

    def _open_quarantine(self) -> _Quarantine:
        qdir = self.directory / QUARANTINE_DIR
        qdir.mkdir(exist_ok=True)
        path = qdir / f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-" \
                      f"{uuid.uuid4().hex[:8]}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        self._quarantine = _Quarantine(path, fd)
        return self._quarantine

    def _close_quarantine(self) -> None:
        if self._quarantine is not None:
            os.close(self._quarantine.fd)
            self._quarantine = None

    # -- recovery -----------------------------------------------------------------------------
    @staticmethod
    def recover(directory: str | os.PathLike[str], *, row_group_rows: int = 16_384,
                include_live: bool = False) -> int:
        """Finish what dead writers left in ``directory`` (``recovery.recover``); returns the
        rows recovered. Logs that could not be recovered are kept and logged as errors; use
        ``recovery.recover`` for the full report."""
        return _recovery.recover(directory, row_group_rows=row_group_rows,
                                 include_live=include_live).rows
