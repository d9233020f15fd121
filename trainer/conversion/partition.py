"""Which part of a parallel conversion a span belongs to.

A GRPO group spans the episodes of one task, so a part must hold whole tasks (whole units:
episodes joined by their tasks; an episode without a task is its own unit).

* Streaming input (the usual: a task's rollouts are written about together): a part is a
  range of whole row groups and owns the units that begin in it (``streaming._assign_part``);
  a process reads from its range's start until its last unit's last row, so N processes
  decode about 1/N of the input each. A split by task hash would make every process decode
  all of it: measured at 0.5x one process with 2 workers (``benchmarks/README_convert.md``).
* Input that does not stream (spilled, or converted in memory) is read whole anyway: a part is
  the tasks whose CRC-32 hash (of the task id, or the episode key) falls in it, as the spill
  buckets are chosen; stable across processes, machines and Python versions.

Every process of one conversion takes the same route (it is decided from the input alone).
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
