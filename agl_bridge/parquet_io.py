"""Parquet file IO shared by every writer and reader: atomic writes, file discovery, checks.

A reader must never see half a file: each file is written to a hidden temporary name in the
same directory, fsynced, and renamed over its final name (rename is atomic on POSIX). Readers
skip the hidden temporaries, so a producer killed mid-write leaves only a stray temp file.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TMP_PREFIX = ".tmp-"


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


def write_table_atomic(table: pa.Table, path: str | os.PathLike[str], *, mode: int = 0o600,
                       row_group_size: int | None = None) -> Path:
    """Write ``table`` to ``path`` so that ``path`` is either absent or complete.

    Files are created readable by their owner only: traces can hold prompts and user data.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}-{path.name}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            pq.write_table(table, f, row_group_size=row_group_size,
                           **writer_options(table.schema))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def iter_parquet_files(source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
                       ) -> Iterator[Path]:
    """Yield the Parquet files under a file, a directory tree (hive partitions too) or a list.

    Sorted, so every run sees the same order; temporaries of writers still at work are skipped.
    """
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    for src in sources:
        p = Path(src)
        if p.is_dir():
            files = sorted(q for q in p.rglob("*.parquet") if not q.name.startswith(TMP_PREFIX))
            yield from files
        elif p.is_file():
            yield p
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
