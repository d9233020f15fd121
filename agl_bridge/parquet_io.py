"""Parquet file IO shared by every writer and reader: atomic writes, file discovery, checks.

A reader must never see half a file: each file is written to a hidden temporary name in the
same directory, fsynced, and renamed over its final name (rename is atomic on POSIX), then the
directory is fsynced so the rename itself survives a power cut.

Temporaries are named ``.tmp-<pid>-<random>-<final name>.tmp``. They never end in
``.parquet``, so a glob such as DuckDB's ``read_parquet('DIR/**/*.parquet')`` cannot pick up a
file still being written (or left half-written by a killed writer), and they carry the writer's
pid, so ``remove_stale_temps`` can delete those of dead writers and leave live ones alone.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

logger = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"
TMP_SUFFIX = ".tmp"
# ``.tmp-<pid>-...``: ours since temporaries carry a pid. Before, they were
# ``.tmp-<32 hex>-<name>.parquet``: no pid, so only their age can say the writer is gone.
_TMP_PID = re.compile(r"^\.tmp-(\d+)-")
LEGACY_TMP_MAX_AGE_S = 3600.0


class SchemaError(ValueError):
    """A Parquet file lacks a column the reader needs; the message names file and column."""


def writer_options(schema: pa.Schema) -> dict:
    """How every Parquet file of ours is encoded (``pq.ParquetWriter`` keyword arguments).

    * zstd throughout.
    * Dictionary encoding only for string columns (names, ids, versions repeat). Token ids and
      logprobs gain nothing from a dictionary: writing them with one took twice as long.
    * ``BYTE_STREAM_SPLIT`` for the numbers inside lists (token ids, logprobs): byte planes
      compress better (token ids use two or three of their four bytes), and write and read
      faster (figures: benchmarks/README_convert.md). Readers: Arrow 17+, DuckDB 1.1+
      (numbers other than floats).
    * Min/max statistics only for scalar columns: those of id lists serve no query.
    """
    dictionary, encoding, statistics = [], {}, []
    for f in schema:
        t = f.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            dictionary.append(f.name)
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            v = t.value_type
            if (pa.types.is_integer(v) and v.bit_width >= 32) or pa.types.is_floating(v):
                encoding[f"{f.name}.list.element"] = "BYTE_STREAM_SPLIT"  # Parquet's path
        elif not pa.types.is_nested(t):
            statistics.append(f.name)
    return {"compression": "zstd", "use_dictionary": dictionary,
            "column_encoding": encoding or None, "write_statistics": statistics}


def temp_path(path: str | os.PathLike[str]) -> Path:
    """Where ``path`` is written before its rename: same directory (rename must not cross
    file systems), hidden, this process's pid in the name, and no ``.parquet`` ending."""
    path = Path(path)
    return path.with_name(f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}-{path.name}"
                          f"{TMP_SUFFIX}")


def write_temp(table: pa.Table, path: str | os.PathLike[str], *, mode: int = 0o600,
               row_group_size: int | None = None) -> Path:
    """First half of an atomic write: ``table`` as a complete, fsynced temporary beside
    ``path``; returns the temporary. Nothing is left behind if this raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            pq.write_table(table, f, row_group_size=row_group_size,
                           **writer_options(table.schema))
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_temp_batches(batches: Iterable[pa.RecordBatch], schema: pa.Schema,
                       path: str | os.PathLike[str], *, row_group_size: int,
                       mode: int = 0o600, memory_pool: pa.MemoryPool | None = None
                       ) -> tuple[Path, int]:
    """``write_temp`` for batches read one at a time: memory holds one row group of Arrow data
    (``row_group_size`` rows), not the whole file. Returns (temporary, rows written); nothing
    is left behind if this raises, and a temporary with no rows is left to the caller.
    ``memory_pool``: where the Parquet writer allocates (Arrow's default pool when None).

    After each row group the pool returns what it no longer uses to the system: mimalloc,
    Arrow's default, otherwise keeps the freed encoding buffers of every row group resident
    (figures: benchmarks/README.md, export memory)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))  # ours, owner-only
    rows = 0
    pool = memory_pool or pa.default_memory_pool()
    try:
        # Arrow's own file, not a Python one: pages are written from Arrow's buffers with no
        # Python bytes copy of each
        with pa.OSFile(str(tmp), "wb") as sink:
            with pq.ParquetWriter(sink, schema, memory_pool=memory_pool,
                                  **writer_options(schema)) as writer:
                pending: list[pa.RecordBatch] = []
                held = 0
                for batch in batches:
                    pending.append(batch)
                    held += batch.num_rows
                    if held >= row_group_size:
                        table = pa.Table.from_batches(pending, schema=schema)
                        cut = held - held % row_group_size
                        writer.write_table(table.slice(0, cut), row_group_size=row_group_size)
                        pending = table.slice(cut).to_batches()
                        held -= cut
                        rows += cut
                        pool.release_unused()
                if held:
                    writer.write_table(pa.Table.from_batches(pending, schema=schema),
                                       row_group_size=row_group_size)
                    rows += held
        pool.release_unused()
        fsync_path(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, rows


def publish(tmp: Path, path: str | os.PathLike[str]) -> Path:
    """Second half: rename the temporary over ``path`` and fsync the directory, so that once
    this returns the file survives a power cut too (callers delete their source after it)."""
    path = Path(path)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
    return path


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_table_atomic(table: pa.Table, path: str | os.PathLike[str], *, mode: int = 0o600,
                       row_group_size: int | None = None) -> Path:
    """Write ``table`` to ``path`` so that ``path`` is either absent or complete.

    Files are created readable by their owner only: traces can hold prompts and user data.
    """
    return publish(write_temp(table, path, mode=mode, row_group_size=row_group_size), path)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (on this host's pid namespace). Ours counts as alive."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def is_temp(path: Path) -> bool:
    return path.name.startswith(TMP_PREFIX)


def remove_stale_temps(root: str | os.PathLike[str], *, now: float | None = None) -> list[Path]:
    """Delete temporaries under ``root`` whose writer is gone; return them.

    A temporary carrying a pid is stale when that process no longer exists. One without a pid
    (written before temporaries carried one) is stale once unmodified for
    ``LEGACY_TMP_MAX_AGE_S``: a writer renames its temporary seconds after its last byte.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    now = time.time() if now is None else now
    removed = []
    for tmp in root.rglob(f"{TMP_PREFIX}*"):
        m = _TMP_PID.match(tmp.name)
        try:
            if m:
                if int(m.group(1)) == os.getpid() or pid_alive(int(m.group(1))):
                    continue
            elif now - tmp.stat().st_mtime < LEGACY_TMP_MAX_AGE_S:
                continue
            if not tmp.is_file():
                continue
            tmp.unlink()
        except FileNotFoundError:  # its writer renamed it, or another recovery got there
            continue
        removed.append(tmp)
    if removed:
        logger.info("agl_bridge: removed %d temporary file(s) left by dead writers under %s",
                    len(removed), root)
    return removed


def iter_parquet_files(source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
                       ) -> Iterator[Path]:
    """Yield the Parquet files under a file, a directory tree (hive partitions too) or a list.

    Sorted, so every run sees the same order; temporaries of writers still at work are skipped.
    """
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    for src in sources:
        p = Path(src)
        if p.is_dir():
            # temporaries no longer end in .parquet; the check still hides older ones
            files = sorted(q for q in p.rglob("*.parquet") if not is_temp(q))
            yield from files
        elif p.is_file():
            yield p
        elif p.exists() or p.is_symlink():  # a FIFO, a device, a broken or looping link
            raise FileNotFoundError(f"{p}: not a regular file or a directory")
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")


def read_checked(path: Path, required: Sequence[str],
                 columns: Sequence[str] | None = None) -> pa.Table:
    """Read one file, refusing it with a message naming the file and the missing column.

    ``columns``: read only these (those the file has), skipping e.g. JSON blobs a reader does
    not use; Parquet is columnar, so the others are never decoded.
    """
    schema = pq.read_schema(path)
    missing = [c for c in required if c not in schema.names]
    if missing:
        raise SchemaError(
            f"{path}: missing required column(s) {', '.join(repr(c) for c in missing)}"
            f" (has: {', '.join(schema.names)})"
        )
    if columns is not None:
        return pq.read_table(path, columns=[c for c in columns if c in schema.names])
    return pq.read_table(path)
