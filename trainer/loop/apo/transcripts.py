"""Rewarded episodes as readable transcripts: what the optimizer reads of how a prompt did.

The text is the judge's view of an episode (``trainer/judging/spans.py``: each LLM call's
messages in time order with the agent's name; token ids decoded with ``tokenizer`` when the
store has no messages); the reward is the episode's mean transition reward after conversion,
so every source the product reads counts (inline rewards, feedback, evaluation events, recipes,
judges' verdicts), or the team's own ``score`` when its result lines name the episode.

APO reads text only, so token ids are never needed: ``text_traces`` gives conversion LLM calls
that have none (a hosted API; another instrumentor's spans, put in our shape by
``conversion/foreign.py``, their sessions as episodes) a one-token placeholder, so that their
episodes are rewarded as any other; the transitions it builds are read for their rewards and
thrown away.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_bridge.trainer.conversion.sources import Source
from agl_bridge.trainer.judging.spans import read_episodes, tokenizer_decoder
from agl_bridge.trainer.rewards.judge import EpisodeText, shorten


@dataclass(frozen=True)
class Transcript:
    episode: str
    task: str | None
    reward: float
    text: str
    # the agent's own system prompt: as its spans record it apart from the message a framework
    # built around it (agl_bridge.prompt.text: MassGen's coordination message), else its first
    # system message whole; "" or None: it has none
    system: str | None = None


def converted_rewards(source: Source, config: Any = None, *,
                      evaluations_from: Source | None = None) -> dict[str, float]:
    """Episode -> mean transition reward, through conversion (``config``: a ``ConvertConfig``,
    e.g. the loop's, with its recipe; ``evaluations_from``: where feedback for them may be, a
    live traces directory; episodes with no reward from any source are left out)."""
    import math

    import pyarrow.parquet as pq

    from agl_bridge.trainer.conversion import convert

    with tempfile.TemporaryDirectory(prefix="agl-apo-") as tmp:
        out = Path(tmp) / "transitions.parquet"
        stats = convert(source, out, config, evaluations_from=evaluations_from)
        if not stats.transitions:
            return {}
        table = pq.read_table(out, columns=["episode_id", "reward"])
    sums: dict[str, list[float]] = {}
    for e, r in zip(table["episode_id"].to_pylist(), table["reward"].to_pylist()):
        if e is not None and r is not None and math.isfinite(r):
            sums.setdefault(e, []).append(r)
    return {e: math.fsum(v) / len(v) for e, v in sums.items()}


PLACEHOLDER_IDS = [0]  # a call's ids where it has none: its text is what APO reads


@contextlib.contextmanager
def text_traces(source: Source) -> Iterator[tuple[Source, int]]:
    """``(source, 0)`` when every LLM call in it has token ids; else ``(a copy, n)`` for the
    ``with`` block: other instrumentors' calls in our shape (messages, operation, agent; their
    sessions as episodes), and the ``n`` calls that have messages but no ids given a
    placeholder, so conversion rewards their episodes (inline rewards, feedback, evaluation
    events, recipes and judges' verdicts, as for any episode). A source with no span Parquet
    is given back as it is (its readers name it)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from agl_bridge import semconv as sc
    from agl_bridge.trainer.conversion import ConversionStats
    from agl_bridge.trainer.conversion.foreign import (
        normalize,
        trace_sessions,
        with_session_episodes,
    )
    from agl_bridge.trainer.conversion.sources import read_spans, span_files

    if not span_files(source):
        yield source, 0
        return
    spans = read_spans(source, ConversionStats())
    read = normalize(with_session_episodes(spans, trace_sessions([spans])), ConversionStats())
    chat = pc.fill_null(pc.equal(read["operation_name"], sc.OP_CHAT), False)
    no_ids = pc.and_(chat, pc.or_(pc.is_null(read["prompt_token_ids"]),
                                  pc.is_null(read["completion_token_ids"])))
    has_text = pc.fill_null(pc.match_substring(read["attributes"],
                                               f'"{sc.GEN_AI_INPUT_MESSAGES}"'), False)
    fill = pc.and_(no_ids, has_text)
    n = pc.sum(fill).as_py() or 0
    if read is spans and not n:
        yield source, 0
        return
    for name in ("prompt_token_ids", "completion_token_ids"):
        column = read[name]
        placeholder = pa.array([PLACEHOLDER_IDS] * read.num_rows, column.type)
        read = read.set_column(read.column_names.index(name), name,
                               pc.if_else(fill, placeholder, column))
    with tempfile.TemporaryDirectory(prefix="agl-apo-text-") as tmp:
        pq.write_table(read, Path(tmp) / "spans.parquet")
        yield tmp, n


Fingerprint = tuple[tuple[str, int, int], ...]


def _fingerprint(source: Source) -> Fingerprint | None:
    """Each file under ``source`` with its size and modification time (None: one cannot be
    read, so nothing may be taken as unchanged)."""
    from agl_bridge.parquet_io import iter_parquet_files

    try:
        return tuple((str(p), st.st_size, st.st_mtime_ns)
                     for p in iter_parquet_files(source) for st in (p.stat(),))
    except OSError:
        return None


class TextCopy:
    """One :func:`text_traces` of a round's span files, shared by its readers: the loop's
    count of rewarded episodes while it waits for them, the prompt watch and the search all
    read the same files, and each ``text_traces`` reads them all, puts other instrumentors'
    spans in our shape and may write a copy. :meth:`of` gives the copy it holds while no file
    under the source was added, removed or changed (path, size, modification time), else
    makes a new one and removes the old; :meth:`close` removes it (the end of the round).

    Keyed by the whole set of files, never file by file: putting one file in our shape needs
    the others (a session's traces, a trace's spans, a span's parents may be in several)."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._key: Fingerprint | None = None
        self._held: tuple[Source, int] = ("", 0)

    def of(self, source: Source) -> tuple[Source, int]:
        """``text_traces(source)``'s ``(readable, n)``, valid until the next call or
        :meth:`close`."""
        key = _fingerprint(source)
        if key is None or key != self._key:
            self.close()
            self._held = self._stack.enter_context(text_traces(source))
            self._key = key
        return self._held

    def close(self) -> None:
        self._key = None
        self._stack.close()

    def __enter__(self) -> TextCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def result_rewards(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Episode -> the team's own ``score`` for it, from result lines that name the episode."""
    return {r["episode_id"]: float(r["score"]) for r in results
            if isinstance(r.get("episode_id"), str)
            and isinstance(r.get("score"), (int, float)) and not isinstance(r["score"], bool)}


def transcripts(source: Source, rewards: Mapping[str, float], *, max_chars: int,
                tokenizer: str | None = None, agent: str | None = None) -> list[Transcript]:
    """The rewarded episodes under ``source`` as text, those where ``agent`` spoke (all when
    None); raises ``ValueError`` naming the source when none is left."""
    decoder = tokenizer_decoder(tokenizer) if tokenizer else None
    episodes = read_episodes(source, decoder)
    head = f"[{agent}] system: "

    def system(e: EpisodeText) -> str | None:
        recorded = episodes.prompts.get(e.episode, {}).get(agent) if agent else None
        if recorded is not None:
            return recorded
        return next((b[len(head):] for b in e.blocks if b.startswith(head)), None)

    out = [Transcript(e.episode, e.task, rewards[e.episode], shorten(e.text, max_chars),
                      system(e))
           for e in episodes.texts if e.episode in rewards
           and (agent is None or any(b.startswith(f"[{agent}]") for b in e.blocks))]
    if not out:
        why = "; ".join(list(episodes.failed.values())[:3] + episodes.problems[:3])
        raise ValueError(f"{source}: no rewarded episode{' of ' + agent if agent else ''} can "
                         f"be read as text ({len(episodes.texts)} episodes as text, "
                         f"{len(rewards)} rewarded){': ' + why if why else ''}; capture at "
                         f"AGL_BRIDGE_CAPTURE=messages, or pass the tokenizer")
    return out


def best_and_worst(pool: Sequence[Transcript], n: int, rng: random.Random
                   ) -> tuple[list[Transcript], list[Transcript]]:
    """Up to ``n`` episodes for a critique: the best half and the worst half by reward (ties
    broken by a seeded shuffle, so each critique may see different episodes)."""
    shuffled = list(pool)
    rng.shuffle(shuffled)
    ranked = sorted(shuffled, key=lambda t: t.reward, reverse=True)
    best_n = (min(n, len(ranked)) + 1) // 2
    worst_n = min(n, len(ranked)) - best_n
    best = ranked[:best_n]
    worst = [t for t in ranked[::-1][:worst_n] if t not in best]
    return best, worst
