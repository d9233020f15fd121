"""Span Parquet -> the episodes a judge reads (``rewards.judge.EpisodeText``).

Only LLM spans (``operation_name = chat``) are read, and of them only the columns the text
needs: ids (trace, span, episode, task), agent name, start time, status, the token id lists,
and the ``attributes`` JSON (where ``gen_ai.input.messages`` / ``gen_ai.output.messages``
live at capture level ``messages``). An episode is the ``episode_id``; spans without one are
one episode per trace (``trace:<trace id>``, as conversion keys them).

Malformed input is named and the rest goes on: a file that is not span Parquet or cannot be
read is skipped (named); a span whose attributes are not JSON is named and read from its ids;
an episode with a call whose text cannot be built is reported with the span and not judged.
The same span in two files (a recovered write-ahead log) counts once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agl_bridge import semconv as sc
from agl_bridge.parquet_io import iter_parquet_files
from agl_bridge.schema import SPAN_SCHEMA
from agl_bridge.trainer.rewards.judge import EpisodeText
from agl_bridge.trainer.rewards.judge_text import (
    Call,
    Decode,
    EpisodeTextError,
    episode_blocks,
)

COLUMNS = ("trace_id", "span_id", "start_time_unix_nano", "status_code", "status_message",
           "episode_id", "task_id", "agent_name", "operation_name", "prompt_token_ids",
           "completion_token_ids", "attributes")
REQUIRED = ("trace_id", "span_id", "operation_name")


@dataclass
class Episodes:
    """What a span directory holds for a judge."""

    texts: list[EpisodeText] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # episode -> why it cannot be read
    problems: list[str] = field(default_factory=list)  # files and spans, named
    files: int = 0
    calls: int = 0
    # episode -> agent -> its own system prompt as its earliest call recording it apart from
    # the messages shows it (agl_bridge.prompt.text; MassGen's agents); elsewhere an agent's
    # own prompt is its first system message
    prompts: dict[str, dict[str, str]] = field(default_factory=dict)


def _read_file(path: Path) -> pa.Table:
    """The LLM spans of one file, in span schema types; raises ValueError naming the file."""
    if not path.is_file():  # a FIFO named *.parquet would block the reader forever
        raise ValueError(f"{path}: not a regular file; skipped")
    try:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        missing = [c for c in REQUIRED if c not in names]
        if missing:
            raise ValueError(f"{path}: not span Parquet (no column {', '.join(missing)}); "
                             f"skipped")
        table = pf.read(columns=[c for c in COLUMNS if c in names])
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{path}: unreadable ({type(exc).__name__}: {exc}); skipped") from exc
    table = table.filter(pc.fill_null(pc.equal(table["operation_name"], sc.OP_CHAT), False))
    columns = []
    for name in COLUMNS:
        f = SPAN_SCHEMA.field(name)
        if name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, f.type))
            continue
        try:
            columns.append(table[name].cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ValueError(f"{path}: column {name!r} is {table[name].type}, expected "
                             f"{f.type} ({exc}); skipped") from exc
    return pa.Table.from_arrays(columns, names=list(COLUMNS))


def _json(value: Any, where: str) -> Any:
    """A JSON attribute value (the exporter stores structured values as JSON strings)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise EpisodeTextError(f"{where} is not valid JSON ({exc})") from None
    return value


def _call(row: dict[str, Any], path: Path, problems: list[str]) -> Call:
    span = f"{row['trace_id']}/{row['span_id']}"
    attributes: dict[str, Any] = {}
    if row.get("attributes"):
        try:
            parsed = json.loads(row["attributes"])
            if not isinstance(parsed, dict):
                raise ValueError("not an object")
            attributes = parsed
        except ValueError as exc:
            problems.append(f"{path}: span {span}: attributes are not a JSON object ({exc}); "
                            f"read from its token ids")
    inputs = attributes.get(sc.GEN_AI_INPUT_MESSAGES)
    outputs = attributes.get(sc.GEN_AI_OUTPUT_MESSAGES)
    failed = ((row.get("status_message") or "error") if row.get("status_code") == "ERROR"
              else None)
    prompt = attributes.get(sc.PROMPT_TEXT)
    return Call(span=span, agent=row.get("agent_name"),
                start=row.get("start_time_unix_nano") or 0,
                inputs=_json(inputs, f"span {span}: {sc.GEN_AI_INPUT_MESSAGES}"),
                outputs=_json(outputs, f"span {span}: {sc.GEN_AI_OUTPUT_MESSAGES}"),
                prompt_ids=row.get("prompt_token_ids"),
                completion_ids=row.get("completion_token_ids"), failed=failed,
                prompt=prompt if isinstance(prompt, str) else None)


def read_episodes(source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                  decoder: Callable[[], Decode] | None = None) -> Episodes:
    """The episodes under ``source`` (a span Parquet file or directory tree, or a list), as
    text.
    ``decoder`` makes the token id decoder; it is called only when a call has ids but no
    messages (so a messages-level store never loads a tokenizer)."""
    out = Episodes()
    files = list(iter_parquet_files(source))
    if not files:
        raise FileNotFoundError(f"no span Parquet files under {source}")
    calls: dict[str, list[Call]] = {}
    tasks: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    for path in files:
        try:
            table = _read_file(path)
        except ValueError as exc:
            out.problems.append(str(exc))
            continue
        out.files += 1
        for row in table.to_pylist():
            ident = (row["trace_id"], row["span_id"])
            if ident in seen:
                continue
            seen.add(ident)
            episode = row["episode_id"] or f"trace:{row['trace_id']}"
            if row.get("task_id") is not None:
                tasks.setdefault(episode, row["task_id"])
            try:
                call = _call(row, path, out.problems)
            except EpisodeTextError as exc:
                out.failed.setdefault(episode, f"{path}: {exc}")
                continue
            calls.setdefault(episode, []).append(call)
            out.calls += 1
    decode: Decode | None = None
    for episode, episode_calls in calls.items():
        if episode in out.failed:
            continue
        if decode is None and decoder is not None and any(
                not c.has_messages and c.has_ids for c in episode_calls):
            decode = decoder()
        try:
            blocks = episode_blocks(episode_calls, decode)
        except EpisodeTextError as exc:
            out.failed[episode] = str(exc)
            continue
        out.texts.append(EpisodeText(episode, tasks.get(episode), blocks,
                                     min(c.start for c in episode_calls)))
        prompts: dict[str, str] = {}
        for c in sorted(episode_calls, key=lambda c: (c.start, c.span)):
            if c.agent and c.prompt is not None:
                prompts.setdefault(c.agent, c.prompt)
        if prompts:
            out.prompts[episode] = prompts
    return out


def tokenizer_decoder(directory: str | os.PathLike[str]) -> Callable[[], Decode]:
    """A maker of the decode function for token ids: the served model's tokenizer from a
    local directory (never a hub: ``local_files_only``), loaded on first need."""
    def make() -> Decode:
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # pragma: no cover - the train extra is missing
            raise RuntimeError("reading token ids needs transformers (the train extra)") from exc
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--tokenizer {directory}: cannot load a tokenizer there "
                             f"({type(exc).__name__}: {exc})") from exc
        size = len(tokenizer)

        def decode(ids: Sequence[int], is_prompt: bool) -> str:
            bad = [i for i in ids if not 0 <= i < size]
            if bad:
                raise ValueError(f"id {bad[0]} is outside the vocabulary of {size}")
            # the prompt keeps the chat template's markup (it shows who speaks); the answer
            # drops its end-of-turn token
            return str(tokenizer.decode(list(ids), skip_special_tokens=not is_prompt))

        return decode

    return make
