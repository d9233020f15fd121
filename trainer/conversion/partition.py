"""Which part of a parallel conversion a span belongs to: by the hash of its episode's task.

A GRPO group spans the episodes of one task, so a part must hold whole tasks; an episode
without a task is its own unit. The hash is CRC-32 of the task id (or the episode key), the
same the spill buckets use: stable across processes, machines and Python versions (Python's
``hash`` of a string is salted per process). Pure functions of the keys.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge.trainer.arrow import arr, np_array, to_numpy
from agl_bridge.trainer.conversion.columns import episode_keys

Part = tuple[int, int]  # (index, count): this process converts part index of count


def parse_part(text: str) -> Part:
    """``"I/N"`` (0 <= I < N) as given on the command line."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--part must be I/N (e.g. 0/4), got {text!r}") from None
    return check_part((i, n))


def check_part(part: Part) -> Part:
    i, n = part
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"part must be (index, count) with 0 <= index < count, got {part}")
    return part


def key_hashes(keys: Sequence[str]) -> Any:
    """CRC-32 per key (numpy uint32)."""
    return np.fromiter((zlib.crc32(k.encode()) for k in keys), np.uint32, len(keys))


def unit_parts(hashes: Any, unit: Any, count: int) -> Any:
    """Part per episode (numpy) when episodes are joined into units (episodes sharing a
    task): the smallest hash among a unit's members decides, so a unit never splits."""
    n_units = int(unit.max()) + 1 if len(unit) else 0
    low = np.full(n_units, np.iinfo(np.uint32).max, np.uint32)
    np.minimum.at(low, unit, hashes)
    return (low[unit] % count).astype(np.int64)


def rows_in_part(spans: pa.Table, part: Part, tasks: dict[str, str] | None = None) -> pa.Table:
    """The rows of ``spans`` whose episode's task (``tasks``: episode -> task, when the rows
    alone may not name it; otherwise read from the rows' ``task_id``) hashes to ``part``."""
    i, n = part
    if n == 1 or spans.num_rows == 0:
        return spans
    enc = pc.dictionary_encode(episode_keys(spans))
    episodes = [str(e) for e in enc.dictionary.to_pylist()]
    if tasks is None:
        tasks = {}
        if "task_id" in spans.column_names:
            have = spans.filter(pc.is_valid(spans["task_id"]))
            for e, t in zip(arr(episode_keys(have)).to_pylist(), have["task_id"].to_pylist()):
                tasks.setdefault(str(e), str(t))
    mine = key_hashes([tasks.get(e, e) for e in episodes]) % n == i
    indices = to_numpy(enc.indices).astype(np.int64)
    return spans.filter(np_array(mine[indices]))
