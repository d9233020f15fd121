"""Deterministic synthetic multi-agent span sets, written for our converter and for Agent Lightning.

Used by ``convert_vs_agentlightning.py``: both converters must see the same spans, each in the
form it reads, and producing them must not be part of what is timed. So this module generates
(from a seed, identically in any Python 3.11 venv: only the standard library at top level):

* per episode (one rollout of a team on one task): a root ``agl_bridge.episode`` span; 2-3 agents
  taking turns round robin, 3-5 turns each; per turn an ``invoke_agent {agent}`` span holding one
  ``chat {model}`` LLM span, or (30% of turns) two with an ``execute_tool {tool}`` span between
  them: a tool call and the follow-up, whose prompt extends the first call's context (its prompt
  + completion + 20-120 tool-result ids), as a real follow-up does; 7% of turns have a second
  call with an unrelated prompt instead. LLM spans carry 100-400 prompt token ids (up to 600 for
  follow-ups), 20-80 completion ids and their logprobs; at the end one
  ``agl_bridge.reward`` span (scope ``episode``, a distinct value per episode so that a reward
  that lands on another episode's call can be recognised). About 28.7 spans per episode.
* episodes run concurrently, as rollouts do: episode ``i`` starts ``i * 350 ms`` (+ jitter) after
  the first and lasts about 11 s, so about 32 are in flight at any time and their spans
  interleave in time.

Two writers, each run in the venv that has its library:

* ``ours`` (dev venv): span rows through ``agl_bridge.otel.rows.build_row`` into
  ``agl_bridge.otel.parquet_writer.SpanParquetWriter`` (the real capture layout: hive partitions,
  files rotated at 100k rows / 64 MiB, 16k-row groups, zstd), fed in batches of 2048 spans in
  global end-time order (the order an exporter sees them), streaming: a few episodes and one
  batch are in memory at a time, never the whole set.
* ``peer`` (Agent Lightning venv): the same spans as Agent Lightning 0.3.0 ``Span`` objects, in
  the shape its ``TracerTraceToTriplet`` reads: LLM spans named ``openai.chat.completion`` with
  int-list attributes ``prompt_token_ids`` / ``response_token_ids``, ``gen_ai.response.id``
  (dedup key, and the key the comparison uses) and ``logprobs.content`` (JSON list, the field it
  reads logprobs from); ``agent.name`` on the ``invoke_agent`` spans (the attribute it takes agent
  names from); the reward as an ``agentlightning.annotation`` span with
  ``agentlightning.reward.0.name = "primary"`` and ``agentlightning.reward.0.value`` (what its
  ``emit_reward`` writes). Same trace/span/parent ids, times, names and every other attribute as
  ours. Per episode ``rollout_id`` = episode id, ``sequence_id`` in end-time order (what its store
  returns per rollout). Pickled as lists of ``(episode_id, [Span, ...])``, 500 episodes per
  ``chunk-NNNNN.pkl``, so the peer process loads them without paying for generation.

Run: ``python benchmarks/convert_synthetic.py --episodes N [--seed S] --format ours|peer --out DIR``
(``--count`` prints spans/LLM calls without writing; ``--episodes-for-spans M`` prints the smallest
N giving at least M spans). Writes ``DIR/_manifest.json`` last, so a directory with a manifest
is complete (the leading ``_`` makes pyarrow datasets skip it).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT_VERSION = 2  # bump when the generated spans change: cached sets are regenerated

SERVICE = "synthetic-team"
T0_NS = 1_748_736_000 * 10**9  # 2025-06-01T00:00:00Z: every span in one date partition up to ~2M
GAP_NS = 350_000_000  # episode i starts at T0 + i * GAP (+ jitter < GAP): ~32 episodes in flight
MS = 1_000_000
VOCAB = 49_152
POOL = 1 << 20  # token ids / logprobs are random slices of seeded pools (fast, still distinct)
AGENTS = (("planner", "plan"), ("coder", "implement"), ("critic", "review"))
TOOLS = ("search", "run_tests", "read_file", "write_file")
POLICY = "team@v3"  # served adapter name: request model and policy version
TASKS_PER_GROUP = 8  # rollouts of one task (a GRPO group): episodes 8k..8k+7 share task k
PEER_CHUNK_EPISODES = 500
RESOURCE = {"service.name": SERVICE, "telemetry.sdk.language": "python",
            "telemetry.sdk.name": "opentelemetry", "telemetry.sdk.version": "1.45.2"}


def writer_fingerprint(fmt: str) -> str | None:
    """Ours: a digest of how span Parquet is encoded (``parquet_io.writer_options`` and the
    schema), so that a cached set written with other encodings or types is regenerated. The
    peer's pickles: none."""
    if fmt != "ours":
        return None
    import hashlib

    from agl_bridge.parquet_io import writer_options
    from agl_bridge.schema import SPAN_SCHEMA

    return hashlib.sha256(repr((writer_options(SPAN_SCHEMA), SPAN_SCHEMA)).encode()
                          ).hexdigest()[:12]


@dataclass(slots=True)
class SynSpan:
    """One span, independent of either library's format."""

    kind: str  # episode | agent | chat | tool | reward
    trace_id: str
    span_id: str
    parent_span_id: str | None
    start: int
    end: int
    episode_id: str
    task_id: str
    agent: str | None = None
    role: str | None = None
    turn: int | None = None
    tool: str | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    reward: float | None = None


# -- generation ---------------------------------------------------------------------------------
def _plan(seed: int, i: int) -> list[tuple[int, int, bool, int]]:
    """Episode i's structure: per agent-turn (agent index, turn, has tool, LLM calls)."""
    r = random.Random(f"{seed}:{i}:plan")
    n_agents, turns = r.choice((2, 3)), r.randint(3, 5)
    plan = []
    for turn in range(turns):
        for a in range(n_agents):
            tool = r.random() < 0.3
            plan.append((a, turn, tool, 2 if tool or r.random() < 0.1 else 1))
    return plan


def plan_counts(seed: int, i: int) -> tuple[int, int]:
    """(spans, LLM calls) of episode i, without generating it."""
    plan = _plan(seed, i)
    calls = sum(p[3] for p in plan)
    return 2 + len(plan) + calls + sum(p[2] for p in plan), calls


def episodes_for_spans(min_spans: int, seed: int) -> int:
    total = n = 0
    while total < min_spans:
        total += plan_counts(seed, n)[0]
        n += 1
    return n


class Pools:
    def __init__(self, seed: int) -> None:
        r = random.Random(f"{seed}:pools")
        self.ids = r.choices(range(VOCAB), k=POOL)
        self.logprobs = [round(-r.expovariate(1.5), 6) for _ in range(POOL)]


def episode_id(seed: int, i: int) -> str:
    return f"ep-{seed}-{i:07d}"


def episode_start(seed: int, i: int) -> int:
    return T0_NS + i * GAP_NS + random.Random(f"{seed}:{i}:start").randrange(GAP_NS)


def generate_episode(seed: int, i: int, pools: Pools) -> list[SynSpan]:
    """Episode i's spans, sorted by (end, start): the order an exporter receives them."""
    r = random.Random(f"{seed}:{i}:content")
    ep, task = episode_id(seed, i), f"task-{seed}-{i // TASKS_PER_GROUP:06d}"
    trace = format(r.getrandbits(128) | 1, "032x")

    def sid() -> str:
        return format(r.getrandbits(64) | 1, "016x")

    start = episode_start(seed, i)
    root = SynSpan("episode", trace, sid(), None, start, 0, ep, task)
    spans = [root]
    t = start + MS
    for a, turn, tool, n_calls in _plan(seed, i):
        name, role = AGENTS[a]
        agent = SynSpan("agent", trace, sid(), root.span_id, t, 0, ep, task, name, role, turn)
        spans.append(agent)
        cursor = t + 2 * MS
        context: list[int] | None = None  # after a tool call: prompt + completion + result
        for c in range(n_calls):
            plen, clen = r.randint(100, 400), r.randint(20, 80)
            po, co = r.randrange(POOL - 400), r.randrange(POOL - 80)
            prompt = context if context is not None else pools.ids[po:po + plen]
            completion = pools.ids[co:co + clen]
            dur = 30 * MS + clen * 15 * MS + r.randrange(20 * MS)
            spans.append(SynSpan(
                "chat", trace, sid(), agent.span_id, cursor, cursor + dur, ep, task, name, role,
                turn, prompt_ids=prompt, completion_ids=completion,
                logprobs=pools.logprobs[co:co + clen]))
            cursor += dur + MS
            context = None
            if tool and c == 0:
                tdur = r.randint(5, 300) * MS
                spans.append(SynSpan("tool", trace, sid(), agent.span_id, cursor, cursor + tdur,
                                     ep, task, name, role, turn, tool=r.choice(TOOLS)))
                cursor += tdur + MS
                ro = r.randrange(POOL - 120)
                context = prompt + completion + pools.ids[ro:ro + r.randint(20, 120)]
        agent.end = cursor + MS
        t = agent.end + r.randint(1, 20) * MS
    spans.append(SynSpan("reward", trace, sid(), root.span_id, t, t, ep, task,
                         reward=round(r.random(), 6)))
    root.end = t + MS
    spans.sort(key=lambda s: (s.end, s.start))
    return spans


def iter_export_order(n_episodes: int, seed: int, pools: Pools) -> Iterator[SynSpan]:
    """Every span of episodes 0..n-1 in global end-time order, streaming (bounded memory):
    episodes start in index order, so a span ending before episode i+1's earliest possible
    start can be released once episodes up to i are generated."""
    heap: list[tuple[int, int, int, SynSpan]] = []
    seq = 0
    for i in range(n_episodes):
        for s in generate_episode(seed, i, pools):
            heapq.heappush(heap, (s.end, s.start, seq, s))
            seq += 1
        bound = T0_NS + (i + 1) * GAP_NS
        while heap and heap[0][0] < bound:
            yield heapq.heappop(heap)[3]
    while heap:
        yield heapq.heappop(heap)[3]


# -- our format ---------------------------------------------------------------------------------
def _ours_row(s: SynSpan) -> dict[str, Any]:
    from agl_bridge import semconv as sc
    from agl_bridge.otel.rows import build_row

    attrs: dict[str, Any] = {sc.EPISODE_ID: s.episode_id, sc.TASK_ID: s.task_id}
    if s.agent is not None:
        attrs.update({sc.GEN_AI_AGENT_NAME: s.agent, sc.AGENT_ROLE: s.role, sc.TURN_INDEX: s.turn})
    kind = "INTERNAL"
    if s.kind == "episode":
        name = sc.SPAN_EPISODE
    elif s.kind == "agent":
        name = sc.invoke_agent_span_name(s.agent)
        attrs[sc.GEN_AI_OPERATION_NAME] = sc.OP_INVOKE_AGENT
    elif s.kind == "chat":
        name, kind = sc.chat_span_name(POLICY), "CLIENT"
        attrs.update(_chat_attrs(s))
        attrs.update({
            sc.PROMPT_TOKEN_IDS: s.prompt_ids, sc.COMPLETION_TOKEN_IDS: s.completion_ids,
            sc.COMPLETION_LOGPROBS: s.logprobs, sc.POLICY_VERSION: POLICY,
            sc.TOKEN_IDS_STATUS: sc.TOKEN_IDS_RECORDED, sc.SERVER_KIND: "vllm",
        })
    elif s.kind == "tool":
        name = sc.execute_tool_span_name(s.tool)
        attrs.update({sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: s.tool,
                      sc.GEN_AI_TOOL_CALL_ID: f"call_{s.span_id}"})
    else:
        name = sc.SPAN_REWARD
        attrs.update({sc.REWARD_VALUE: s.reward, sc.REWARD_KIND: sc.RewardKind.TASK,
                      sc.REWARD_SCOPE: sc.RewardScope.EPISODE, sc.REWARD_NAME: "task"})
    return build_row(
        trace_id=s.trace_id, span_id=s.span_id, parent_span_id=s.parent_span_id, name=name,
        kind=kind, start_time_unix_nano=s.start, end_time_unix_nano=s.end, status_code="UNSET",
        status_message=None, attributes=attrs, resource=RESOURCE, scope_name="agl_bridge")


def _chat_attrs(s: SynSpan) -> dict[str, Any]:
    """The GenAI attributes an LLM span carries in both formats (names shared by both)."""
    return {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": POLICY, "gen_ai.request.temperature": 1.0,
        "gen_ai.request.max_tokens": 512, "gen_ai.response.model": POLICY,
        "gen_ai.response.id": response_id(s.span_id), "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": len(s.prompt_ids), "gen_ai.usage.output_tokens":
        len(s.completion_ids), "server.address": "127.0.0.1", "server.port": 8000,
    }


def response_id(span_id: str) -> str:
    return f"chatcmpl-{span_id}"


def write_ours(n_episodes: int, seed: int, out: Path, batch: int = 2048) -> dict[str, Any]:
    from agl_bridge.otel.parquet_writer import SpanParquetWriter

    writer = SpanParquetWriter(out, background_rotation=False, recover=False)
    pools, rows, spans, calls = Pools(seed), [], 0, 0
    for s in iter_export_order(n_episodes, seed, pools):
        rows.append(_ours_row(s))
        spans += 1
        calls += s.kind == "chat"
        if len(rows) >= batch:
            writer.write_rows(rows)
            rows = []
    writer.write_rows(rows)
    writer.close()
    return {"spans": spans, "llm_calls": calls, "files": writer.files_written}


# -- Agent Lightning's format -------------------------------------------------------------------
PEER_LLM_SPAN = "openai.chat.completion"  # matches TracerTraceToTriplet's llm_call_match
PEER_REWARD_SPAN = "agentlightning.annotation"  # what agentlightning.emit_reward creates


def _peer_span(s: SynSpan, seq: int, resource: Any) -> Any:
    from agentlightning.types import Span

    attrs: dict[str, Any] = {"agl_bridge.episode.id": s.episode_id, "agl_bridge.task.id": s.task_id}
    if s.agent is not None:
        attrs.update({"gen_ai.agent.name": s.agent, "agl_bridge.agent.role": s.role,
                      "agl_bridge.turn.index": s.turn})
    if s.kind == "episode":
        name = "agl_bridge.episode"
    elif s.kind == "agent":
        name = f"invoke_agent {s.agent}"
        attrs.update({"gen_ai.operation.name": "invoke_agent", "agent.name": s.agent})
    elif s.kind == "chat":
        name = PEER_LLM_SPAN
        attrs.update(_chat_attrs(s))
        attrs.update({
            "prompt_token_ids": list(s.prompt_ids), "response_token_ids": list(s.completion_ids),
            "logprobs.content": json.dumps([{"token": "", "logprob": lp} for lp in s.logprobs],
                                           separators=(",", ":")),
            "agl_bridge.policy.version": POLICY,
        })
    elif s.kind == "tool":
        name = f"execute_tool {s.tool}"
        attrs.update({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": s.tool,
                      "gen_ai.tool.call.id": f"call_{s.span_id}"})
    else:
        name = PEER_REWARD_SPAN
        attrs.update({"agentlightning.reward.0.name": "primary",
                      "agentlightning.reward.0.value": s.reward})
    return Span.from_attributes(
        attributes=attrs, rollout_id=s.episode_id, attempt_id="attempt-0", sequence_id=seq,
        name=name, trace_id=s.trace_id, span_id=s.span_id, parent_id=s.parent_span_id,
        start_time=s.start / 1e9, end_time=s.end / 1e9, resource=resource)


def write_peer(n_episodes: int, seed: int, out: Path) -> dict[str, Any]:
    import pickle

    from agentlightning.types import OtelResource

    resource = OtelResource(attributes=dict(RESOURCE), schema_url="")
    pools, chunk, spans, calls, files = Pools(seed), [], 0, 0, 0

    def flush() -> None:
        nonlocal chunk, files
        if chunk:
            path = out / f"chunk-{files:05d}.pkl"
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                pickle.dump(chunk, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
            files += 1
            chunk = []

    for i in range(n_episodes):
        syn = generate_episode(seed, i, pools)
        chunk.append((episode_id(seed, i),
                      [_peer_span(s, seq, resource) for seq, s in enumerate(syn, 1)]))
        spans += len(syn)
        calls += sum(s.kind == "chat" for s in syn)
        if len(chunk) >= PEER_CHUNK_EPISODES:
            flush()
    flush()
    return {"spans": spans, "llm_calls": calls, "files": files,
            "chunk_episodes": PEER_CHUNK_EPISODES}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", choices=("ours", "peer"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--count", action="store_true", help="print span counts, write nothing")
    ap.add_argument("--episodes-for-spans", type=int, metavar="M")
    a = ap.parse_args(argv)
    if a.episodes_for_spans:
        print(episodes_for_spans(a.episodes_for_spans, a.seed))
        return 0
    if a.episodes is None:
        ap.error("--episodes is required")
    if a.count:
        counts = [plan_counts(a.seed, i) for i in range(a.episodes)]
        print(json.dumps({"episodes": a.episodes, "spans": sum(c[0] for c in counts),
                          "llm_calls": sum(c[1] for c in counts)}))
        return 0
    if a.format is None or a.out is None:
        ap.error("--format and --out are required")
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    info = (write_ours if a.format == "ours" else write_peer)(a.episodes, a.seed, a.out)
    info.update({"format": a.format, "format_version": FORMAT_VERSION,
                 "writer": writer_fingerprint(a.format), "episodes": a.episodes,
                 "seed": a.seed, "generation_s": round(time.perf_counter() - t0, 1)})
    tmp = a.out / "_manifest.json.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, a.out / "_manifest.json")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
