"""``convert_parallel``: one conversion over several processes, each converting the tasks of
its part (``partition.py``) into its own file, then one output.

Each process reads the whole input but converts (and holds) only its part's tasks; the parts
together hold exactly the rows of a one-process conversion (in another order: part by part).
After the parts: the ``batch`` and ``key:`` baselines, which span all parts, are finished over
the joined output, as one process would. On several machines, ``convert(part=(i, n))`` (the
CLI's ``--part I/N``) converts one part where the input is; a directory holding the parts is a
transitions input for ``train_from_traces`` and ``agl-bridge train`` (read in name order).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pyarrow.parquet as pq

from agl_bridge.parquet_io import temp_path, writer_options
from agl_bridge.schema import TRANSITION_SCHEMA
from agl_bridge.trainer.conversion.config import ConversionStats, ConvertConfig
from agl_bridge.trainer.conversion.finish import finish_file
from agl_bridge.trainer.conversion.sources import Source


def _part(source: Source, out: str, config: ConvertConfig, part: tuple[int, int],
          max_rows_in_memory: int, evaluations_from: Source | None) -> ConversionStats:
    from agl_bridge.trainer.conversion.engine import convert

    return convert(source, out, config, max_rows_in_memory=max_rows_in_memory,
                   tune_allocators=True, evaluations_from=evaluations_from, part=part,
                   finish=False)


def convert_parallel(source: Source, out_path: str | os.PathLike[str],
                     config: ConvertConfig | None = None, *, workers: int = 2,
                     max_rows_in_memory: int = 100_000,
                     evaluations_from: Source | None = None,
                     on_part: Callable[[int, ConversionStats], None] | None = None
                     ) -> ConversionStats:
    """``convert`` over ``workers`` processes (spawned: no state of this one is copied);
    the output (written atomically) and the statistics are the one-process run's, the rows in
    part order. ``on_part(i, stats)`` is called as each part finishes."""
    from agl_bridge.trainer.conversion.engine import convert

    cfg = config or ConvertConfig()
    if workers < 1:
        raise ValueError(f"workers must be positive, got {workers}")
    out = Path(out_path)
    if workers == 1:
        return convert(source, out, cfg, max_rows_in_memory=max_rows_in_memory,
                       evaluations_from=evaluations_from)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts_dir = out.parent / f".{out.name}.parts-{uuid.uuid4().hex[:8]}"
    parts_dir.mkdir()
    try:
        files = [parts_dir / f"part-{i:05d}-of-{workers:05d}.parquet" for i in range(workers)]
        stats: dict[int, ConversionStats] = {}
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = {pool.submit(_part, source, str(files[i]), cfg, (i, workers),
                                   max_rows_in_memory, evaluations_from): i
                       for i in range(workers)}
            for future in as_completed(futures):
                i = futures[future]
                stats[i] = future.result()
                if on_part is not None:
                    on_part(i, stats[i])
        total = ConversionStats()
        for i in range(workers):
            total.merge(stats[i])
        total.files = stats[0].files
        join_parts(files, out)
        finish_file(out, cfg, total)
        return total
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)


def join_parts(parts: list[Path], out: Path) -> None:
    """The parts' row groups, in part order, into one transitions file (written to a temporary
    name, fsynced, renamed): no row is decoded into Python."""
    tmp = temp_path(out)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            with pq.ParquetWriter(f, TRANSITION_SCHEMA,
                                  **writer_options(TRANSITION_SCHEMA)) as writer:
                for path in parts:
                    pf = pq.ParquetFile(path)
                    for g in range(pf.num_row_groups):
                        writer.write_table(pf.read_row_group(g))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
