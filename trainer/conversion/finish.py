"""The last pass: advantages whose baseline spans the whole output (``batch``, ``key:``).

The stages convert unit by unit and write as they go; a ``batch`` or ``key`` group spans units,
so its transitions are written with a provisional advantage of 0 and fixed here, once every
reward is known: the group ids and rewards are read back (three small columns), the
advantages computed (``rewards.baselines.global_advantages``) and the file rewritten batch by
batch with the new column (written to a temporary name, then renamed). Nothing happens when no
transition has such a baseline (the default).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agl_bridge.schema import TRANSITION_SCHEMA
from agl_bridge.trainer.arrow import codes, lit, np_array, to_numpy
from agl_bridge.trainer.conversion.config import ConversionStats, ConvertConfig
from agl_bridge.trainer.conversion.streaming import transitions_file
from agl_bridge.trainer.rewards.baselines import GROUP, global_advantages


def needs_finish(stats: ConversionStats) -> bool:
    """Whether some transitions have a baseline over the whole output (batch, key:)."""
    return any(n for b, n in stats.baselines.items() if b not in (GROUP, "none"))


def _advantages(table: pa.Table, cfg: ConvertConfig, stats: ConversionStats
                ) -> np.ndarray | None:
    """The advantage column with the global groups' values, or None when none changed."""
    adv, which, groups, flat = global_advantages(
        table["group_id"].to_pylist(), to_numpy(table["reward"]), codes(table["episode_id"]),
        unit=cfg.advantage_unit, scale=cfg.scale_advantages)
    stats.groups += groups
    stats.zero_variance_groups += flat
    if not which.any():
        return None
    out = to_numpy(pc.fill_null(table["advantage"], lit(0.0))).copy()
    out[which] = adv[which]
    return out


def finish_table(table: pa.Table, cfg: ConvertConfig, stats: ConversionStats) -> pa.Table:
    if not needs_finish(stats) or table.num_rows == 0:
        return table
    adv = _advantages(table, cfg, stats)
    if adv is None:
        return table
    i = table.schema.get_field_index("advantage")
    return table.set_column(i, TRANSITION_SCHEMA.field("advantage"), np_array(adv))


def finish_files(paths: list[Path], cfg: ConvertConfig, stats: ConversionStats) -> None:
    """The global baselines over the rows of all ``paths`` together (the parts of one
    conversion), each file rewritten with its own slice of the advantages."""
    if not needs_finish(stats):
        return
    smalls = [pq.ParquetFile(p).read(  # not read_table: pyarrow.dataset imports pandas
        columns=["group_id", "reward", "episode_id", "advantage"]) for p in paths]
    adv = _advantages(pa.concat_tables(smalls), cfg, stats)
    if adv is None:
        return
    start = 0
    for path, small in zip(paths, smalls):
        _rewrite(path, adv[start:start + small.num_rows])
        start += small.num_rows


def _rewrite(path: Path, adv: np.ndarray) -> None:
    i = TRANSITION_SCHEMA.get_field_index("advantage")
    pf = pq.ParquetFile(path)
    with transitions_file(path) as writer:
        start = 0
        for g in range(pf.num_row_groups):
            part = pf.read_row_group(g)
            n = part.num_rows
            part = part.set_column(i, TRANSITION_SCHEMA.field("advantage"),
                                   np_array(adv[start:start + n]))
            writer.write_table(part)
            start += n
