"""``agl-bridge export``: transitions as Hugging Face ``datasets`` in the shapes TRL's trainers
take, so the data captured here trains with the tools a team already has.

* ``sft``: the transitions to imitate (``select``: the best of each group, as ``objective="sft"``
  picks them, a reward threshold, or all), one example each: ``messages`` (conversational,
  where the spans hold the captured messages), else ``prompt`` and ``completion`` text (decoded
  with ``tokenizer``); always ``input_ids`` and ``completion_mask``, the ids the server saw
  and sampled, which ``SFTTrainer`` trains on as they are (a dataset with ``input_ids`` is not
  tokenized again; the mask keeps the loss on the completion, and off observation tokens
  merged into a turn).
* ``dpo``: preference pairs from one group (same task, agent and turn) and the same prompt ids,
  every pair whose rewards differ by more than ``margin``: ``prompt``, ``chosen``,
  ``rejected`` (conversational or text, as for ``sft``), ``score_chosen`` and
  ``score_rejected``, and the ids as TRL's preference collator names them (``prompt_ids``,
  ``chosen_ids``, ``rejected_ids``; ``DPOTrainer`` tokenizes the text itself).
* ``prompt-completion``: every transition, with ``reward``, ``advantage``, ``group_id`` and the
  ids (``prompt_ids``, ``completion_ids``, ``completion_mask``, ``behaviour_logprobs``).

Every row keeps where it came from: ``episode_id``, ``task_id``, ``agent_name``,
``turn_index``, ``group_id``, ``policy_version``, ``retokenized``. ``datasets`` is imported only
here (the ``export`` extra), transformers only for ``tokenizer``.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from agl_bridge import semconv as sc
from agl_bridge.trainer.conversion.export_config import ExportConfig
from agl_bridge.trainer.conversion.retokenize import chat_messages
from agl_bridge.trainer.rewards.selection import select_for_sft

EXTRA = "export"  # the extra of pyproject.toml that installs datasets
PROVENANCE = ("episode_id", "task_id", "agent_name", "turn_index", "group_id", "policy_version",
              "retokenized")
COLUMNS = PROVENANCE + ("prompt_ids", "completion_ids", "completion_mask",
                        "behaviour_logprobs", "reward", "advantage", "span_id", "merged_calls")


@dataclass
class ExportSummary:
    transitions: int = 0
    rows: int = 0
    conversational: bool = False  # messages captured for every transition
    decoded: bool = False  # texts decoded from the ids with the tokenizer
    groups_without_pairs: int = 0  # dpo: groups whose rewards all tie (within margin)
    prompts_apart: int = 0  # dpo: transitions of a group whose prompt differs from the others'
    files: list[str] = field(default_factory=list)

    def summary(self) -> str:
        text = (f"{self.rows} row(s) from {self.transitions} transition(s), "
                + ("conversational (captured messages)" if self.conversational else
                   "text decoded from the ids" if self.decoded else "token ids only"))
        if self.groups_without_pairs or self.prompts_apart:
            text += (f"; {self.groups_without_pairs} group(s) gave no pair, {self.prompts_apart}"
                     " transition(s) had a prompt no other of their group had")
        return text


class Texts:
    """The transitions' texts: conversational when the spans hold every transition's captured
    messages (a dataset is one or the other throughout: TRL decides by its first row), else
    the ids decoded with ``tokenizer``, else none (the ids alone)."""

    def __init__(self, config: ExportConfig, rows: list[dict[str, Any]]) -> None:
        self.messages: dict[str, tuple[list[dict[str, Any]], str]] = _captured(
            config.spans, {r["span_id"] for r in rows}) if config.spans else {}
        self.conversational = bool(rows) and all(
            r["merged_calls"] == 1 and r["span_id"] in self.messages for r in rows)
        self.tokenizer = None
        if config.tokenizer is not None and not self.conversational:
            from transformers import AutoTokenizer  # only when asked for

            self.tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)

    def prompt(self, row: dict[str, Any]) -> list[dict[str, Any]] | str | None:
        """The conversation before the completion, or the prompt as the server saw it."""
        if self.conversational:
            return self.messages[row["span_id"]][0]
        if self.tokenizer is None:
            return None
        return str(self.tokenizer.decode(row["prompt_ids"], skip_special_tokens=False))

    def completion(self, row: dict[str, Any]) -> list[dict[str, Any]] | str | None:
        """The answer: an assistant message after a conversation, else text."""
        if self.conversational:
            return [{"role": "assistant", "content": self.messages[row["span_id"]][1]}]
        if self.tokenizer is None:
            return None
        return str(self.tokenizer.decode(row["completion_ids"], skip_special_tokens=True))


def _captured(spans: str, wanted: set[str]) -> dict[str, tuple[list[dict[str, Any]], str]]:
    """span id -> (its input messages, its answer's text) where capture kept both."""
    table = pq.read_table(spans, columns=["span_id", "attributes"],
                          filters=[("span_id", "in", sorted(wanted))])
    out: dict[str, tuple[list[dict[str, Any]], str]] = {}
    for span_id, raw in zip(table["span_id"].to_pylist(), table["attributes"].to_pylist()):
        attributes = json.loads(raw) if raw else {}
        inputs = _json(attributes.get(sc.GEN_AI_INPUT_MESSAGES))
        outputs = _json(attributes.get(sc.GEN_AI_OUTPUT_MESSAGES))
        if inputs and outputs:
            out[span_id] = (chat_messages(inputs), chat_messages(outputs[:1])[0]["content"])
    return out


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def read_rows(transitions: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A transitions file (or a directory of parts) as rows."""
    table = pq.read_table(transitions)
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{transitions}: not a transitions file (no {', '.join(missing)})")
    return table.select(list(COLUMNS)).to_pylist()


def sft_rows(rows: list[dict[str, Any]], texts: Texts, config: ExportConfig
             ) -> list[dict[str, Any]]:
    if config.select == "all":
        keep = [True] * len(rows)
    else:
        keep = select_for_sft(np.array([r["reward"] for r in rows], dtype=np.float64),
                              np.array([str(r["group_id"]) for r in rows]), config.select,
                              config.min_reward).tolist()
    out = []
    for r, k in zip(rows, keep):
        if not k:
            continue
        prompt, completion = texts.prompt(r), texts.completion(r)
        example: dict[str, Any] = {}
        if isinstance(prompt, list) and isinstance(completion, list):
            example["messages"] = prompt + completion
        elif prompt is not None:
            example.update(prompt=prompt, completion=completion)
        example.update(
            input_ids=r["prompt_ids"] + r["completion_ids"],
            completion_mask=[0] * len(r["prompt_ids"]) + list(r["completion_mask"]),
            reward=r["reward"], **{c: r[c] for c in PROVENANCE})
        out.append(example)
    return out


def dpo_rows(rows: list[dict[str, Any]], texts: Texts, config: ExportConfig,
             summary: ExportSummary) -> list[dict[str, Any]]:
    groups: dict[tuple[str, tuple[int, ...]], list[dict[str, Any]]] = defaultdict(list)
    sizes: dict[str, int] = defaultdict(int)
    for r in rows:
        groups[(str(r["group_id"]), tuple(r["prompt_ids"]))].append(r)
        sizes[str(r["group_id"])] += 1
    out = []
    paired: set[str] = set()
    for (group, _), members in groups.items():
        if len(members) == 1:
            summary.prompts_apart += sizes[group] > 1
            continue
        members.sort(key=lambda m: -m["reward"])
        for i, chosen in enumerate(members):
            for rejected in members[i + 1:]:
                if not chosen["reward"] - rejected["reward"] > config.margin:
                    continue
                paired.add(group)
                out.append(_pair(chosen, rejected, texts))
    summary.groups_without_pairs = len(sizes) - len(paired)
    return out


def _pair(chosen: dict[str, Any], rejected: dict[str, Any], texts: Texts) -> dict[str, Any]:
    prompt = texts.prompt(chosen)
    example: dict[str, Any] = {}
    if prompt is not None:
        example.update(prompt=prompt, chosen=texts.completion(chosen),
                       rejected=texts.completion(rejected))
    example.update(
        prompt_ids=chosen["prompt_ids"], chosen_ids=chosen["completion_ids"],
        rejected_ids=rejected["completion_ids"], score_chosen=chosen["reward"],
        score_rejected=rejected["reward"],
        **{c: chosen[c] for c in PROVENANCE if c not in ("episode_id", "policy_version",
                                                          "retokenized")},
        chosen_episode_id=chosen["episode_id"], rejected_episode_id=rejected["episode_id"])
    return example


def prompt_completion_rows(rows: list[dict[str, Any]], texts: Texts) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        prompt = texts.prompt(r)
        example: dict[str, Any] = {}
        if prompt is not None:
            example.update(prompt=prompt, completion=texts.completion(r))
        example.update({c: r[c] for c in ("prompt_ids", "completion_ids", "completion_mask",
                                          "behaviour_logprobs", "reward", "advantage")},
                       **{c: r[c] for c in PROVENANCE})
        out.append(example)
    return out


def export(transitions: str | os.PathLike[str], out: str | os.PathLike[str],
           config: ExportConfig | None = None) -> ExportSummary:
    """Write ``transitions`` to ``out`` as a Hugging Face dataset of ``config.format``."""
    try:
        from datasets import Dataset
    except ImportError:
        raise ImportError(f"agl-bridge export writes Hugging Face datasets: pip install "
                          f"'agl-bridge[{EXTRA}]'") from None
    cfg = config or ExportConfig()
    rows = read_rows(transitions)
    texts = Texts(cfg, rows)
    summary = ExportSummary(transitions=len(rows))
    if cfg.format == "sft":
        examples = sft_rows(rows, texts, cfg)
    elif cfg.format == "dpo":
        examples = dpo_rows(rows, texts, cfg, summary)
    else:
        examples = prompt_completion_rows(rows, texts)
    if not examples:
        raise ValueError(f"nothing to export as {cfg.format} from {summary.transitions} "
                         f"transition(s)" + (f": {summary.summary()}" if rows else ""))
    summary.rows = len(examples)
    summary.conversational = texts.conversational
    summary.decoded = texts.tokenizer is not None
    dataset = Dataset.from_list(examples)
    target = Path(out)
    if "arrow" in cfg.file_format:
        dataset.save_to_disk(str(target))
        summary.files.append(str(target))
    target.mkdir(parents=True, exist_ok=True)
    if "parquet" in cfg.file_format:
        dataset.to_parquet(str(target / "data.parquet"))
        summary.files.append(str(target / "data.parquet"))
    if "jsonl" in cfg.file_format:
        dataset.to_json(str(target / "data.jsonl"), lines=True)
        summary.files.append(str(target / "data.jsonl"))
    return summary
