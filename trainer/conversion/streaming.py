"""Streaming conversion: memory follows a batch and the units in flight, not the dataset.

A *unit* is a task with all its episodes (a GRPO group spans the episodes of one task;
episodes that share tasks are joined, by union-find over the (episode, task) pairs), or an
episode without a task. A first pass (``stream_plan``) over two or three small columns finds,
for each unit, the position of its last row in the input. The second (``convert_streaming``)
reads batches of 16k rows one batch ahead in a thread, converts every unit as soon as it has
been read whole, writes its transitions from another thread, and holds back only the rows of
units still open. If the plan finds that more than ``max_rows_in_memory`` rows would be held
back (a task's episodes spread over the whole input), it returns None and the caller spills
instead (``spill.py``).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agl_bridge.parquet_io import SchemaError, temp_path, writer_options
from agl_bridge.schema import TRANSITION_SCHEMA
from agl_bridge.trainer.arrow import arr, codes, lit, np_array, to_numpy
from agl_bridge.trainer.conversion import reasons
from agl_bridge.trainer.conversion.columns import conform, episode_keys
from agl_bridge.trainer.conversion.config import ConversionStats, ConvertConfig
from agl_bridge.trainer.conversion.memory import release_memory
from agl_bridge.trainer.conversion.partition import Part
from agl_bridge.trainer.conversion.sources import WrongTypes, check_file, conform_types, why
from agl_bridge.trainer.conversion.stages import convert_rows
from agl_bridge.trainer.rewards.evaluations import EvaluationReward


@dataclass
class StreamPlan:
    files: list[tuple[Path, int, str | None]]  # path, first row's position, why unreadable
    episodes: pa.Array  # episode keys
    done_at: Any  # numpy, per episode: position of the last row of its unit
    first: Any  # numpy, per episode: position of its first row
    unit_first: Any  # numpy, per episode: position of the first row of its unit
    batch_rows: int
    batches: int
    # Parallel conversion (``part``): this process converts the units that begin in rows
    # [lo, hi), a range of whole row groups, and reads from lo until ``stop`` (the last of
    # those units' rows), never the rest: N processes decode about 1/N of the input each.
    keep: Any = None  # per episode: its unit is this part's; None: not partitioned
    first_part: bool = True  # this process counts what is not per unit (files)
    lo: int = 0
    hi: int = 0
    stop: int = 0
    row_groups: list[list[int]] | None = None  # per file: rows of each row group

    def lookup(self, keys: pa.Array, start: int, end: int) -> tuple[Any, Any, Any, Any]:
        """For rows at positions [start, end) with these episode keys: (episode known, done
        at, unit begun before ``start``, row in this part), hashing only the episodes that
        can be there."""
        cand = np.flatnonzero((self.first < end) & (self.done_at >= start))
        idx = pc.index_in(keys, value_set=self.episodes.take(np_array(cand)))
        known = (to_numpy(pc.is_valid(idx)) if idx.null_count
                 else np.ones(len(keys), bool))
        ep = cand[to_numpy(pc.fill_null(idx, lit(0, idx.type)))] if len(
            cand) else np.zeros(len(keys), np.int64)
        done = np.where(known, self.done_at[ep] if len(cand) else 0, np.iinfo(np.int64).max)
        if self.keep is None:
            mine = np.ones(len(keys), bool)
        else:  # a row of no known episode: the part whose range holds it
            at = np.arange(start, end)
            mine = np.where(known, self.keep[ep] if len(cand) else False,
                            (at >= self.lo) & (at < self.hi))
        return known, done, known & (self.unit_first[ep] < start if len(cand) else False), mine


_PLAN_COLUMNS = ["episode_id", "trace_id", "task_id"]


def stream_plan(files: list[Path], max_rows_in_memory: int, columns: Sequence[str],
                part: Part | None = None) -> StreamPlan | None:
    """First pass, over two or three small columns: where each episode's unit (its task: a
    GRPO group spans the episodes of one task; episodes sharing a task are joined; an episode
    without a task is its own unit) has been read whole. None when streaming would hold more
    than ``max_rows_in_memory`` rows waiting for units to complete (units spread across the
    whole input): then the caller spills. Numpy aggregation only (no Acero: importing it costs
    about half a second)."""
    batch_rows = max(1, min(16_384, max_rows_in_memory // 2))
    keys, firsts, lasts, counts, pair_eps, pair_tasks = [], [], [], [], [], []
    plan_files: list[tuple[Path, int, str | None]] = []
    row_groups: list[list[int]] = []
    boundaries: list[int] = []
    pos = 0
    for path, summary in _map_files(lambda p: _plan_file(p, columns), files):
        if isinstance(summary, str):  # unreadable: counted (and named) in the second pass
            plan_files.append((path, pos, summary))
            row_groups.append([])
            continue
        plan_files.append((path, pos, None))
        n, dictionary, first, last, count, pairs, groups = summary
        row_groups.append(groups)
        if n == 0:
            continue
        boundaries += list(range(pos + batch_rows, pos + n, batch_rows)) + [pos + n]
        keys.append(dictionary)
        firsts.append(first + pos)
        lasts.append(last + pos)
        counts.append(count)
        if pairs is not None:
            pair_eps.append(pairs[0])
            pair_tasks.append(pairs[1])
        pos += n
    if not keys:
        z = np.zeros(0, np.int64)
        return StreamPlan(plan_files, pa.nulls(0, pa.string()), z, z, z, batch_rows, 0,
                          None if part is None or part[1] == 1 else z.astype(bool),
                          part is None or part[0] == 0, row_groups=row_groups)
    enc = pc.dictionary_encode(pa.chunked_array(keys).combine_chunks())
    ep_of = to_numpy(enc.indices).astype(np.int64)
    episodes = enc.dictionary
    n_eps = len(episodes)
    first = np.full(n_eps, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, ep_of, np.concatenate(firsts))
    last = np.zeros(n_eps, np.int64)
    np.maximum.at(last, ep_of, np.concatenate(lasts))
    count = np.bincount(ep_of, weights=np.concatenate(counts), minlength=n_eps).astype(np.int64)
    unit = units(episodes, pair_eps, pair_tasks)
    n_units = int(unit.max()) + 1
    u_first = np.full(n_units, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(u_first, unit, first)
    u_last = np.zeros(n_units, np.int64)
    np.maximum.at(u_last, unit, last)
    u_count = np.bincount(unit, weights=count, minlength=n_units).astype(np.int64)
    # rows held at a batch boundary b: those of units begun before b and not complete at b
    b = np.asarray(sorted(boundaries), np.int64)
    lo = np.searchsorted(b, u_first, side="right")
    hi = np.searchsorted(b, u_last, side="right")
    held = np.zeros(len(b) + 1, np.int64)
    np.add.at(held, lo, u_count)
    np.add.at(held, np.minimum(hi, len(b)), -u_count)
    if len(b) and int(np.cumsum(held)[:-1].max(initial=0)) > max_rows_in_memory:
        return None
    plan = StreamPlan(plan_files, episodes, u_last[unit], first, u_first[unit], batch_rows,
                      len(boundaries), row_groups=row_groups)
    if part is not None and part[1] > 1:
        _assign_part(plan, part, pos)
    return plan


def _assign_part(plan: StreamPlan, part: Part, total: int) -> None:
    """Part i of n: the row groups from the first starting at or after i/n of the rows, to
    the first starting at or after (i+1)/n; its units: those beginning there."""
    i, n = part
    starts = [start + sum(groups[:g]) for (_, start, _), groups in
              zip(plan.files, plan.row_groups or []) for g in range(len(groups))]
    starts = sorted(set(starts)) + [total]

    def bound(k: int) -> int:
        target = -(-k * total // n)  # ceil
        return next(x for x in starts if x >= target)

    plan.lo, plan.hi = bound(i), bound(i + 1)
    plan.keep = (plan.unit_first >= plan.lo) & (plan.unit_first < plan.hi)
    plan.stop = int(plan.done_at[plan.keep].max()) + 1 if plan.keep.any() else plan.lo
    plan.first_part = i == 0


def _plan_file(path: Path, columns: Sequence[str]) -> tuple[Any, ...] | str:
    """One file's part of the plan, positions relative to the file: (rows, episode keys,
    first and last row and row count per key, distinct (episode, task) pairs or None); the
    exception's name if the file cannot be read. A missing required column raises."""
    try:
        pf = check_file(path, columns)
        names = pf.schema_arrow.names
        t = conform_types(pf.read(columns=[c for c in _PLAN_COLUMNS if c in names and
                                           (c != "trace_id" or _may_be_null(pf, "episode_id"))],
                                  use_threads=False))
    except SchemaError:
        raise
    except (pa.ArrowInvalid, OSError, WrongTypes) as exc:
        return why(exc)
    n = t.num_rows
    groups = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
    if n == 0:
        return 0, None, None, None, None, None, groups
    enc = pc.dictionary_encode(episode_keys(t))
    ep_codes = to_numpy(enc.indices).astype(np.int64)
    k = len(enc.dictionary)
    _, first = np.unique(ep_codes, return_index=True)
    _, last = np.unique(ep_codes[::-1], return_index=True)
    pairs = None
    if "task_id" in t.column_names and t["task_id"].null_count < n:
        task = arr(t["task_id"])
        with_task = np.flatnonzero(to_numpy(task.is_valid()))
        task_codes = codes(task.take(np_array(with_task)))
        width = int(task_codes.max()) + 1
        pair = np.unique(ep_codes[with_task] * width + task_codes)
        tdict = pc.dictionary_encode(task.take(np_array(with_task))).dictionary
        pairs = (enc.dictionary.take(np_array(pair // width)),
                 tdict.take(np_array(pair % width)))
    return (n, enc.dictionary, first, n - 1 - last, np.bincount(ep_codes, minlength=k), pairs,
            groups)


def _map_files(fn: Callable[[Path], Any], files: list[Path]) -> Iterator[tuple[Path, Any]]:
    """(path, fn(path)) in file order, a few files at a time: reading and hashing release the
    GIL, and the plan pass otherwise runs on one core while the others wait for it."""
    workers = min(4, os.cpu_count() or 1, len(files))
    if workers <= 1:
        yield from ((path, fn(path)) for path in files)
        return
    with ThreadPoolExecutor(workers, "agl-bridge-convert-plan") as pool:
        yield from zip(files, pool.map(fn, files))


def _may_be_null(pf: pq.ParquetFile, column: str) -> bool:
    """False only when the file's statistics say the column has no null."""
    meta = pf.metadata
    try:
        i = [pf.schema.column(k).path for k in range(len(pf.schema))].index(column)
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(i).statistics
            if st is None or not st.has_null_count or st.null_count:
                return True
    except (ValueError, IndexError):
        return True
    return False


def units(episodes: pa.Array, pair_eps: list, pair_tasks: list) -> Any:
    """Unit code per episode (numpy): from the distinct (episode, task) pairs, the connected
    component of episodes and tasks (one task per episode: its task); no task: itself."""
    n = len(episodes)
    if not pair_eps:
        return np.arange(n, dtype=np.int64)
    e_idx = pc.index_in(pa.chunked_array(pair_eps).combine_chunks(), value_set=episodes)
    e_idx = to_numpy(e_idx).astype(np.int64)
    t_codes = codes(pa.chunked_array(pair_tasks))
    # union-find over episodes (0..n-1) and tasks (n..): vectorised label propagation
    parent = np.arange(n + int(t_codes.max(initial=-1)) + 1, dtype=np.int64)
    a, b = e_idx, t_codes + n
    while True:
        ra, rb = parent[a], parent[b]
        low = np.minimum(ra, rb)
        changed = (parent[ra] != low) | (parent[rb] != low)
        np.minimum.at(parent, ra, low)
        np.minimum.at(parent, rb, low)
        parent = parent[parent]  # path halving
        if not changed.any():
            break
    while True:  # full compression
        nxt = parent[parent]
        if (nxt == parent).all():
            break
        parent = nxt
    return np.unique(parent[:n], return_inverse=True)[1].reshape(-1).astype(np.int64)


# Batches between two hand-backs of freed memory (``memory.release_memory``). The allocators
# reuse what a batch freed for the next, so memory plateaus within a few batches anyway;
# handing back costs time, since the next batch faults every page in again.
_RELEASE_EVERY = 32


def _read_ahead(plan: StreamPlan, columns: list[str], extra: Sequence[str] = ()
                ) -> Iterator[tuple]:
    """The second pass's reads, one batch ahead in a thread (Parquet decoding releases the
    GIL): ("batch", path, table), ("unreadable", path, why), ("read", path) per file."""
    q: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(item: tuple) -> None:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    partitioned = plan.keep is not None

    def work() -> None:
        try:
            for k, (path, start, unreadable) in enumerate(plan.files):
                if unreadable:
                    if not partitioned:  # partitioned: part 0 notes them up front
                        put(("unreadable", path, unreadable))
                    continue
                first_group = 0
                if partitioned:  # only the row groups from lo, until stop
                    groups = (plan.row_groups or [])[k]
                    if start + sum(groups) <= plan.lo or start >= plan.stop:
                        continue
                    while start + groups[first_group] <= plan.lo:
                        start += groups[first_group]
                        first_group += 1
                try:
                    pf = check_file(path, columns)
                    names = set(pf.schema_arrow.names)
                    # decoded in this thread alone: Arrow's pool would add two more
                    # threads on cores the converter and the writer already keep busy
                    # (benchmarks/README_convert.md)
                    for batch in pf.iter_batches(
                            batch_size=plan.batch_rows, use_threads=False,
                            row_groups=range(first_group, pf.metadata.num_row_groups),
                            columns=[c for c in columns if c in names]):
                        if partitioned and start >= plan.stop:
                            break
                        put(("batch", path, conform(pa.Table.from_batches([batch]), extra),
                             start))
                        start += batch.num_rows
                        if stop.is_set():
                            return
                except (pa.ArrowInvalid, OSError, WrongTypes) as exc:
                    put(("unreadable", path, why(exc)))
                    continue
                if not partitioned:
                    put(("read", path))
        except BaseException as exc:
            put(("error", exc))
        put(("end",))

    thread = threading.Thread(target=work, name="agl-bridge-convert-read", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item[0] == "end":
                return
            if item[0] == "error":
                raise item[1]
            yield item
    finally:
        stop.set()
        thread.join()


@contextmanager
def transitions_file(path: Path) -> Iterator[pq.ParquetWriter]:
    """A transitions Parquet writer whose file takes ``path``'s place, fsynced, only when the
    block ends without an exception: ``path`` is always absent, the old file or the whole new
    one. The temporary is owner-only and never matches *.parquet (readers skip it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            with pq.ParquetWriter(f, TRANSITION_SCHEMA,
                                  **writer_options(TRANSITION_SCHEMA)) as writer:
                yield writer
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def convert_streaming(plan: StreamPlan, out_path: str | os.PathLike[str], cfg: ConvertConfig,
                       columns: list[str], source: str,
                       progress: Callable[[int, int], None] | None,
                       evaluations: Mapping[str, list[EvaluationReward]] | None = None
                       ) -> ConversionStats:
    """Second pass: read in batches; convert the rows of every unit read whole, hold the others
    back; write the transitions as they come. Reading, converting and writing overlap (a
    reader thread one batch ahead, a writer thread one table behind). Memory: a few batches
    plus the held rows."""
    stats = ConversionStats()
    pending: list[pa.Table] = []  # converted, not yet handed to the writer
    done_batches = 0
    writes: list = []

    def flush() -> None:  # ``pool`` and ``writer``: opened below, before the first call
        if pending:
            while writes:  # at most one table waits to be written
                writes.pop(0).result()
            writes.append(pool.submit(writer.write_table, pa.concat_tables(pending)))
            pending.clear()

    def convert(rows: pa.Table, select: Any = None) -> None:
        table, part = convert_rows(rows, cfg, source, select, evaluations)
        stats.merge(part)
        if table.num_rows:
            pending.append(table)
            if sum(t.num_rows for t in pending) >= 8_192:
                flush()

    if plan.keep is not None and plan.first_part:  # the files, counted once for all parts
        stats.files = sum(u is None for _, _, u in plan.files)
        for path, _, unreadable in plan.files:
            if unreadable:
                stats.notes[reasons.unreadable_file(path.name, unreadable)] += 1
    # the pool is left first, so the writer never closes under a write in flight
    with transitions_file(Path(out_path)) as writer, \
            ThreadPoolExecutor(1, "agl-bridge-convert-write") as pool:
        held: pa.Table | None = None  # rows of units still open, one chunk
        held_done = np.zeros(0, np.int64)
        for item in _read_ahead(plan, columns, cfg.extra_columns):
            if item[0] == "unreadable":
                stats.notes[reasons.unreadable_file(item[1].name, item[2])] += 1
                continue
            if item[0] == "read":
                stats.files += 1
                continue
            rows, start = item[2], item[3]
            end = start + rows.num_rows
            _, done, begun, mine = plan.lookup(episode_keys(rows), start, end)
            if not mine.all():  # another process converts the other parts' rows
                rows = rows.filter(np_array(mine))
                done, begun = done[mine], begun[mine]
            complete = done < end
            fresh = complete & ~begun  # units wholly in this batch: converted in place
            if fresh.any():
                convert(rows, None if fresh.all() else fresh)
            late = complete & begun  # units completed now, with rows held before
            held_complete = held_done < end
            parts = []
            if held is not None and held_complete.any():
                parts.append(held.filter(np_array(held_complete)))
            if late.any():
                parts.append(rows.filter(np_array(late)))
            if parts:
                convert(pa.concat_tables(parts).combine_chunks())
            keep = []
            if held is not None and not held_complete.all():
                keep.append((held.filter(np_array(~held_complete)), held_done[~held_complete]))
            if not complete.all():
                keep.append((rows.filter(np_array(~complete)), done[~complete]))
            held = pa.concat_tables([k[0] for k in keep]).combine_chunks() if keep else None
            held_done = (np.concatenate([k[1] for k in keep]) if keep
                         else np.zeros(0, np.int64))
            done_batches += 1
            if done_batches % _RELEASE_EVERY == 0:
                release_memory()
            if progress:
                progress(min(done_batches, plan.batches - 1), plan.batches)
        if held is not None and held.num_rows:  # units cut short by an unreadable file
            convert(held)
        flush()
        while writes:
            writes.pop(0).result()
        if progress:
            progress(plan.batches, plan.batches)
    return stats
