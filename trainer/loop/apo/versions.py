"""Which prompt versions served each episode, read from its chat spans
(``agl_bridge.prompt.version``, recorded by the prompt swap): what the watch and reports need to
group episodes by prompt version as they group them by adapter version.

Only LLM spans are read, and of them the episode key and the attributes JSON; an episode's key
is the sorted, comma-joined set of the versions its calls carried (``reviewer@p0,writer@p3``),
as ``engine.version_key`` joins adapter versions. Episodes none of whose calls carry a version
(no prompt table was set) are left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from agl_bridge import semconv as sc
from agl_bridge.parquet_io import iter_parquet_files
from agl_bridge.trainer.conversion.sources import Source


def episode_prompt_versions(source: Source) -> dict[str, str]:
    """Episode (``episode_id``, else ``trace:<id>``) -> its prompt versions' key."""
    versions: dict[str, set[str]] = {}
    for path in iter_parquet_files(source):
        table = pq.read_table(Path(path), columns=["trace_id", "episode_id", "operation_name",
                                                   "attributes"])
        table = table.filter(pc.fill_null(pc.equal(table["operation_name"], sc.OP_CHAT), False))
        for trace, episode, attributes in zip(table["trace_id"].to_pylist(),
                                              table["episode_id"].to_pylist(),
                                              table["attributes"].to_pylist()):
            try:
                version = json.loads(attributes or "{}").get(sc.PROMPT_VERSION)
            except (ValueError, AttributeError):
                continue  # unreadable attributes: no version to count
            if isinstance(version, str):
                versions.setdefault(episode or f"trace:{trace}", set()).add(version)
    return {e: ",".join(sorted(v)) for e, v in versions.items()}


def key_versions(key: str) -> dict[str, str]:
    """``checker@p0,solver@p2`` -> ``{"checker": "checker@p0", "solver": "solver@p2"}``."""
    return {v.rsplit("@p", 1)[0]: v for v in key.split(",") if "@p" in v}


def matches(carried: Mapping[str, str], state: Mapping[str, str]) -> bool:
    """An episode whose calls carried ``carried`` (agent -> version) was served by ``state``."""
    return bool(carried) and all(state.get(a, v) == v for a, v in carried.items())
