"""What MassGen's spans say about each episode that its result does not: coordination rounds,
restarts, and how many of each agent's replies were valid workflow tool calls.

Read from the span Parquet the MassGen team wrote (``integrations/massgen.py``): a reply is
one ``chat`` span of the agent; a refused one also has a failed ``execute_tool`` span on the
same agent (MassGen's enforcement event: no tool call, a tool not offered, an answer past the
limit, a vote for no agent), so valid replies = replies - refusals; a well-formed reply is one
the server returned as a tool call at all (``agl_bridge.llm.tool_call.names``: vLLM's tool
parser found one), valid or not. ``policy_versions`` names
the versions that answered each agent (the span's ``policy_version``), which is how a test or
a report tells which adapters served a run.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agl_bridge import semconv as sc
from agl_bridge.parquet_io import iter_parquet_files

COLUMNS = ["name", "episode_id", "agent_name", "operation_name", "status_code",
           "coordination_round", "policy_version", "attributes"]


@dataclass
class EpisodeStats:
    """One MassGen run."""

    rounds: int = 0  # highest 0-based coordination round on its spans, + 1
    restarts: int = 0  # agents restarted by another's new answer
    answers: int = 0
    votes: int = 0
    replies: Counter = field(default_factory=Counter)  # agent -> chat calls
    refused: Counter = field(default_factory=Counter)  # agent -> replies MassGen refused
    well_formed: Counter = field(default_factory=Counter)  # agent -> replies with a tool call
    versions: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


def read_spans(spans: Path | Iterable[Path]) -> pa.Table:
    """The columns these statistics need, from a span directory (or several)."""
    dirs = [spans] if isinstance(spans, Path) else list(spans)
    tables = [pq.read_table(f, columns=COLUMNS) for d in dirs for f in iter_parquet_files(d)]
    return pa.concat_tables(tables, promote_options="default") if tables else pa.table(
        {c: pa.array([], pa.string()) for c in COLUMNS})


def episode_stats(spans: Path | Iterable[Path] | pa.Table) -> dict[str, EpisodeStats]:
    """Episode id -> its rounds, restarts, answers, votes, replies and refusals per agent."""
    table = spans if isinstance(spans, pa.Table) else read_spans(spans)
    out: dict[str, EpisodeStats] = defaultdict(EpisodeStats)
    for r in table.to_pylist():
        episode = r["episode_id"]
        if not episode:
            continue
        st = out[episode]
        if r["coordination_round"] is not None:
            st.rounds = max(st.rounds, r["coordination_round"] + 1)
        name, agent = r["name"], r["agent_name"]
        if name == sc.SPAN_RESTART:
            st.restarts += 1
        elif name == sc.SPAN_NEW_ANSWER:
            st.answers += 1
        elif name == sc.SPAN_VOTE:
            st.votes += 1
        elif r["operation_name"] == sc.OP_CHAT and agent:
            st.replies[agent] += 1
            attributes = json.loads(r["attributes"] or "{}")
            st.well_formed[agent] += bool(attributes.get(sc.LLM_TOOL_CALL_NAMES))
            if r["policy_version"]:
                st.versions[agent].add(r["policy_version"])
        elif r["operation_name"] == sc.OP_EXECUTE_TOOL and agent and r["status_code"] == "ERROR":
            st.refused[agent] += 1
    return dict(out)


def summary(stats: Mapping[str, EpisodeStats]) -> dict[str, Any]:
    """Means over episodes, and each agent's share of valid tool calls."""
    n = max(len(stats), 1)
    replies: Counter = Counter()
    refused: Counter = Counter()
    formed: Counter = Counter()
    versions: dict[str, set[str]] = defaultdict(set)
    for st in stats.values():
        replies.update(st.replies)
        refused.update(st.refused)
        formed.update(st.well_formed)
        for agent, seen in st.versions.items():
            versions[agent] |= seen
    return {"episodes": len(stats),
            "rounds": sum(s.rounds for s in stats.values()) / n,
            "restarts": sum(s.restarts for s in stats.values()) / n,
            "valid_tool_calls": {a: round(1 - min(refused[a], k) / k, 4)
                                 for a, k in sorted(replies.items()) if k},
            "well_formed_tool_calls": {a: round(formed[a] / k, 4)
                                       for a, k in sorted(replies.items()) if k},
            "replies": dict(sorted(replies.items())),
            "policy_versions": {a: sorted(v) for a, v in sorted(versions.items())}}


def main(argv: list[str] | None = None) -> None:
    """``python -m agl_bridge.trainer.loop.teams.massgen_stats SPAN_DIR...``: the summary."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    print(json.dumps(summary(episode_stats([Path(a) for a in args])), indent=1))


if __name__ == "__main__":
    main()
