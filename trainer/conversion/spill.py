"""Conversion of input that cannot stream: rows spilled to hash buckets by task, converted
bucket by bucket.

Used when a task's episodes are spread over the whole input (streaming would hold too many
rows back), and when retokenizing. A bucket holds whole tasks (a GRPO group spans the episodes
of one task), so every group is converted whole; memory follows the largest bucket.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agl_bridge.parquet_io import writer_options
from agl_bridge.trainer.arrow import arr
from agl_bridge.trainer.conversion.columns import episode_keys
from agl_bridge.trainer.conversion.config import ConversionStats
from agl_bridge.trainer.conversion.partition import Part, rows_in_part
from agl_bridge.trainer.conversion.sources import read_tables, with_columns
from agl_bridge.trainer.conversion.streaming import transitions_file

Converter = Callable[[pa.Table], tuple[pa.Table, ConversionStats]]


def episode_tasks(files: Sequence[Path]) -> dict[str, str]:
    """Episode -> task, from a cheap first pass over three columns. Buckets must hold whole
    groups, so they are keyed by task."""
    tasks: dict[str, str] = {}
    for path in files:
        try:
            t = pq.ParquetFile(path).read(columns=["episode_id", "trace_id", "task_id"])
            t = t.filter(pc.is_valid(t["task_id"]))
            keys = arr(episode_keys(t.cast(pa.schema([
                pa.field("episode_id", pa.string()), pa.field("trace_id", pa.string()),
                pa.field("task_id", pa.string())]))))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, KeyError):
            continue  # unreadable, of the wrong types or without task ids: counted when read
        for episode, task in zip(keys.to_pylist(), t["task_id"].to_pylist()):
            tasks.setdefault(str(episode), str(task))
    return tasks


def convert_spilled(files: Sequence[Path], out_path: Path, columns: Sequence[str],
                    total_rows: int, max_rows_in_memory: int, convert: Converter,
                    progress: Callable[[int, int], None] | None,
                    part: Part | None = None) -> ConversionStats:
    """Spill ``files`` to buckets of about ``max_rows_in_memory / 2`` rows, then ``convert``
    each bucket and append its transitions to ``out_path`` (written atomically). ``part``:
    only the rows of that part's tasks are spilled (``partition.py``)."""
    buckets = max(2, math.ceil(total_rows / max(1, max_rows_in_memory // 2)))
    stats = ConversionStats()
    spill = Path(tempfile.mkdtemp(prefix="agl-bridge-convert-"))
    try:
        writers: dict[int, pq.ParquetWriter] = {}
        tasks = episode_tasks(files)
        for table in read_tables(files, stats, columns):
            table = with_columns(table, columns)
            if part is not None:
                table = rows_in_part(table, part, tasks)
            keys = arr(episode_keys(table)).to_pylist()
            ids = pa.array([zlib.crc32(tasks.get(k, k).encode()) % buckets for k in keys],
                           pa.int32())
            for b in range(buckets):
                rows = table.filter(pc.equal(ids, b))
                if rows.num_rows:
                    if b not in writers:
                        writers[b] = pq.ParquetWriter(spill / f"{b}.parquet", rows.schema,
                                                      **writer_options(rows.schema))
                    writers[b].write_table(rows)
        for w in writers.values():
            w.close()
        _convert_buckets(spill, sorted(writers), out_path, convert, stats, progress)
        return stats
    finally:
        shutil.rmtree(spill, ignore_errors=True)


def _convert_buckets(spill: Path, buckets: list[int], out_path: Path, convert: Converter,
                     stats: ConversionStats, progress: Callable[[int, int], None] | None
                     ) -> None:
    with transitions_file(out_path) as writer:
        for n, b in enumerate(buckets, 1):
            table, part = convert(pq.ParquetFile(spill / f"{b}.parquet").read())
            stats.merge(part)
            writer.write_table(table)
            if progress:
                progress(n, len(buckets))
