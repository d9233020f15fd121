"""``convert_parallel``: one conversion over several processes, each converting the tasks of
its part (``partition.py``) into its own file of one output directory.

Each process converts only its part's tasks (and, on the streaming route, reads only its
range of the input); the parts together hold exactly the rows of a one-process conversion (in
another order: part by part). After the parts, the ``batch`` and ``key:`` baselines, which
span all parts, are finished over all of them, as one process would. The parts are not joined
into one file: joining would decode and encode every row once more, which cost about as much
as the parallel conversion saved. On several machines, ``convert(part=(i, n))`` (the CLI's
``--part I/N``) converts one part where the input is; a directory holding the parts is a
transitions input for ``train_from_traces`` and ``agl-bridge train`` (read in name order).
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import re
import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from agl_bridge.parquet_io import pid_alive
from agl_bridge.trainer.conversion.config import ConversionStats, ConvertConfig
from agl_bridge.trainer.conversion.finish import finish_files
from agl_bridge.trainer.conversion.sources import Source


def _part(source: Source, out: str, config: ConvertConfig, part: tuple[int, int],
          max_rows_in_memory: int, evaluations_from: Source | None) -> ConversionStats:
    from agl_bridge.trainer.conversion.engine import convert

    return convert(source, out, config, max_rows_in_memory=max_rows_in_memory,
                   tune_allocators=True, evaluations_from=evaluations_from, part=part,
                   finish=False)


def convert_parallel(source: Source, out_dir: str | os.PathLike[str],
                     config: ConvertConfig | None = None, *, workers: int = 2,
                     max_rows_in_memory: int = 100_000,
                     evaluations_from: Source | None = None,
                     on_part: Callable[[int, ConversionStats], None] | None = None
                     ) -> ConversionStats:
    """``convert`` over ``workers`` processes (spawned: no state of this one is copied), each
    writing its part, ``out_dir/part-<i>-of-<n>.parquet``: a transitions directory, which
    ``train_from_traces`` and ``agl-bridge train`` read as one (the parts in name order). The
    statistics are the one-process run's. ``out_dir`` is replaced whole once every part is
    written: a kill leaves the previous one (one killed in the switch itself is put back by
    the next run, ``recover``). ``on_part(i, stats)`` is called as
    each part finishes."""
    cfg = config or ConvertConfig()
    if workers < 1:
        raise ValueError(f"workers must be positive, got {workers}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: a parallel conversion writes a directory of parts; this "
                         "is a file")
    others = [p.name for p in out.iterdir() if not _PART.fullmatch(p.name)] if out.is_dir() \
        else []
    if others:  # replaced whole below: never a directory that holds anything but parts
        raise ValueError(f"{out}: holds {others[:3]}, not only conversion parts; give an "
                         "empty or new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    recover(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        files = [tmp / f"part-{i:05d}-of-{workers:05d}.parquet" for i in range(workers)]
        stats: dict[int, ConversionStats] = {}
        # parts 1.. in spawned processes, part 0 here meanwhile (this process has its imports
        # done: one start-up fewer)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max(1, workers - 1), mp_context=context) as pool:
            futures = {pool.submit(_part, source, str(files[i]), cfg, (i, workers),
                                   max_rows_in_memory, evaluations_from): i
                       for i in range(1, workers)}
            stats[0] = _part(source, str(files[0]), cfg, (0, workers), max_rows_in_memory,
                             evaluations_from)
            if on_part is not None:
                on_part(0, stats[0])
            for future in as_completed(futures):
                i = futures[future]
                stats[i] = future.result()
                if on_part is not None:
                    on_part(i, stats[i])
        total = ConversionStats()
        for i in range(workers):
            total.merge(stats[i])
        total.files = stats[0].files
        finish_files(files, cfg, total)  # the batch and key: baselines, over all parts
        _replace_dir(tmp, out)
        return total
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_PART = re.compile(r"part-\d+-of-\d+\.parquet")


def recover(out: Path) -> list[str]:
    """Undo what a killed ``convert_parallel`` into ``out`` left beside it: its parts in
    progress (``.OUT.tmp-<pid>-*``) are removed; a previous output moved aside for the switch
    (``.OUT.old-<pid>-*``) goes back to ``out`` if the kill came before the new one took its
    place, and is removed otherwise. Only leftovers of processes that no longer run are
    touched (another conversion into ``out`` may be running)."""
    done = []
    for kind in ("old", "tmp"):  # the previous output first: it is what ``out`` was
        for p in sorted(out.parent.glob(f".{glob.escape(out.name)}.{kind}-*")):
            m = re.fullmatch(rf"\.{re.escape(out.name)}\.{kind}-(\d+)-[0-9a-f]+", p.name)
            if m is None or pid_alive(int(m.group(1))):
                continue
            if kind == "old" and not out.exists():
                p.rename(out)
                done.append(f"restored {out.name} from {p.name}")
            else:
                shutil.rmtree(p, ignore_errors=True)
                done.append(f"removed {p.name}")
    return done


def _replace_dir(new: Path, out: Path) -> None:
    """``new`` becomes ``out``; an existing ``out`` is moved aside first and then removed."""
    aside = None
    if out.exists():
        aside = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        out.rename(aside)
    new.rename(out)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
