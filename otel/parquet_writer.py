"""Durable, rotating, hive-partitioned Parquet sink for span rows.

Two promises pull against each other: files should be large (a few per minute, row groups
sized for scans), yet a ``kill -9`` of the producer must lose at most the batch being written,
and no reader may ever see a partial file. A Parquet file is unreadable until its footer is
written, so batches cannot be appended to one durably. Hence a write-ahead log:

* each batch is appended to a per-partition Arrow IPC stream under ``_wal/`` and fsynced before
  ``write_rows`` returns (an IPC stream cut short is still readable up to its last whole batch);
* when a partition's log reaches ``max_file_rows`` / ``max_file_bytes`` / ``max_file_age_s``, its
  batches become one Parquet file (temp name, fsync, rename) and the log is deleted;
* logs left by a dead process are turned into Parquet by ``recover`` (run by every new writer
  on the same directory, and by ``agl-bridge recover``).

Layout: ``<dir>/date=YYYY-MM-DD/service=<name>/part-<utc>-<pid>-<seq>.parquet`` (hive-style, so
pyarrow, pandas and DuckDB read the partitions with no help from us), UTC date of the span start.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from agl_bridge.otel.rows import rows_to_table
from agl_bridge.parquet_io import remove_stale_temps, write_table_atomic
from agl_bridge.schema import SPAN_SCHEMA

logger = logging.getLogger(__name__)

WAL_DIR = "_wal"
QUARANTINE_DIR = "_quarantine"
_PARTITION_KEY = b"agl_bridge.partition"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _partition(row: dict[str, Any]) -> str:
    ns = row.get("start_time_unix_nano") or time.time_ns()
    day = _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc).strftime("%Y-%m-%d")
    service = _UNSAFE.sub("_", row.get("service_name") or "unknown")[:100]
    return f"date={day}/service={service}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class _Log:
    """One partition's open write-ahead log. Its batches live on disk only: rotation reads the
    log back (memory-mapped), so memory does not grow with the file size."""

    partition: str
    path: Path
    file: Any
    writer: pa.ipc.RecordBatchStreamWriter
    opened: float = field(default_factory=time.monotonic)
    rows: int = 0
    bytes: int = 0


class SpanParquetWriter:
    """Thread-safe. ``write_rows`` is durable on return; ``close`` turns every log into Parquet."""

    def __init__(self, directory: str | os.PathLike[str], *, max_file_rows: int = 100_000,
                 max_file_bytes: int = 64 * 2**20, max_file_age_s: float = 60.0,
                 row_group_rows: int = 16_384, recover: bool = True,
                 background_rotation: bool = True) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / WAL_DIR).mkdir(exist_ok=True)
        self.max_file_rows = max_file_rows
        self.max_file_bytes = max_file_bytes
        self.max_file_age_s = max_file_age_s
        self.row_group_rows = row_group_rows
        self._logs: dict[str, _Log] = {}
        self._lock = threading.Lock()
        self._seq = 0
        self._closed = False
        self.files_written = 0
        self.rows_written = 0
        self.rows_quarantined = 0
        if recover:
            self.recovered_rows = self.recover(self.directory, row_group_rows=row_group_rows)
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        if background_rotation and max_file_age_s > 0:
            self._timer = threading.Thread(target=self._rotate_loop, daemon=True,
                                           name="agl-bridge-parquet-rotation")
            self._timer.start()

    # -- writing ----------------------------------------------------------------------------
    def write_rows(self, rows: Sequence[dict[str, Any]]) -> None:
        if not rows:
            return
        by_partition: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_partition.setdefault(_partition(row), []).append(row)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"writer for {self.directory} is closed")
            for partition, part_rows in by_partition.items():
                log = self._logs.get(partition) or self._open(partition)
                table = rows_to_table(part_rows)
                log.writer.write_table(table)
                log.file.flush()
                os.fsync(log.file.fileno())
                log.rows += table.num_rows
                log.bytes += table.nbytes
                if log.rows >= self.max_file_rows or log.bytes >= self.max_file_bytes:
                    try:
                        self._rotate(log)
                    except Exception:  # the batch is durable in the log; recover() finishes
                        logger.exception("agl_bridge: rotating %s failed", log.path)

    def _open(self, partition: str) -> _Log:
        self._seq += 1
        path = self.directory / WAL_DIR / f"{os.getpid()}-{uuid.uuid4().hex[:12]}.arrows"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        f = os.fdopen(fd, "wb")
        schema = SPAN_SCHEMA.with_metadata(
            {**(SPAN_SCHEMA.metadata or {}), _PARTITION_KEY: partition.encode()})
        log = _Log(partition, path, f, pa.ipc.new_stream(f, schema))
        self._logs[partition] = log
        return log

    def _rotate(self, log: _Log) -> None:
        """Log -> Parquet file. Caller holds the lock. On failure the closed log stays on disk
        for ``recover`` and the partition starts a fresh one."""
        del self._logs[log.partition]
        log.writer.close()
        log.file.close()
        with pa.memory_map(str(log.path)) as source:
            table = pa.ipc.open_stream(source).read_all()
            self._write_parquet(table, log.partition)
        log.path.unlink(missing_ok=True)

    def _write_parquet(self, table: pa.Table, partition: str) -> None:
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        name = f"part-{stamp}-{os.getpid()}-{self._seq:06d}-{uuid.uuid4().hex[:6]}.parquet"
        write_table_atomic(table.replace_schema_metadata(SPAN_SCHEMA.metadata),
                           self.directory / partition / name, row_group_size=self.row_group_rows)
        self.files_written += 1
        self.rows_written += table.num_rows

    def _rotate_loop(self) -> None:
        period = max(0.05, min(self.max_file_age_s / 2, 5.0))
        while not self._stop.wait(period):
            self.rotate_old()

    def rotate_old(self) -> None:
        """Rotate logs older than ``max_file_age_s`` (called by the background thread)."""
        now = time.monotonic()
        with self._lock:
            for log in list(self._logs.values()):
                if now - log.opened >= self.max_file_age_s:
                    try:
                        self._rotate(log)
                    except Exception:  # keep the log on disk: recover() will finish the job
                        logger.exception("agl_bridge: rotating %s failed", log.path)

    def flush(self) -> None:
        """Turn every open log into a Parquet file now."""
        with self._lock:
            for log in list(self._logs.values()):
                self._rotate(log)

    def close(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=10)
        self.flush()
        with self._lock:
            self._closed = True

    # -- bad input ----------------------------------------------------------------------------
    def quarantine(self, records: Sequence[dict[str, Any]]) -> Path:
        """Keep what could not become a row (JSON lines, owner-only) and count it."""
        qdir = self.directory / QUARANTINE_DIR
        qdir.mkdir(exist_ok=True)
        path = qdir / f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-" \
                      f"{uuid.uuid4().hex[:8]}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            for record in records:
                f.write(json.dumps(record, default=repr) + "\n")
            f.flush()
            os.fsync(f.fileno())
        with self._lock:
            self.rows_quarantined += len(records)
        logger.warning("agl_bridge: quarantined %d malformed span(s) in %s", len(records), path)
        return path

    # -- recovery -----------------------------------------------------------------------------
    @staticmethod
    def recover(directory: str | os.PathLike[str], *, row_group_rows: int = 16_384,
                include_live: bool = False) -> int:
        """Turn logs left by dead writers into Parquet and delete their temporaries; returns
        the rows recovered.

        A log cut short by a crash yields every batch before the cut. Logs of live processes
        (this one included) are left alone unless ``include_live``: use it only when no writer
        is at work on ``directory``.
        """
        remove_stale_temps(directory)  # never data; they would fill the disk
        wal = Path(directory) / WAL_DIR
        recovered = 0
        for path in sorted(wal.glob("*.arrows")) if wal.is_dir() else []:
            pid = int(path.name.split("-", 1)[0]) if path.name.split("-", 1)[0].isdigit() else -1
            if not include_live and (pid == os.getpid() or _pid_alive(pid)):
                continue
            batches, partition = [], None
            try:
                with pa.ipc.open_stream(path) as reader:
                    partition = (reader.schema.metadata or {}).get(_PARTITION_KEY, b"").decode()
                    while True:
                        try:
                            batches.append(reader.read_next_batch())
                        except StopIteration:
                            break
            except (pa.ArrowInvalid, OSError) as exc:  # cut short mid-batch: keep what came before
                logger.info("agl_bridge: %s ends in a partial batch (%s)", path, exc)
            if batches and partition:
                table = pa.Table.from_batches(batches).replace_schema_metadata(SPAN_SCHEMA.metadata)
                name = f"part-recovered-{path.stem}.parquet"
                write_table_atomic(table, Path(directory) / partition / name,
                                   row_group_size=row_group_rows)
                recovered += table.num_rows
            path.unlink(missing_ok=True)
        return recovered
