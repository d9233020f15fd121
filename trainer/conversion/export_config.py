"""``ExportConfig``: the settings of ``agl-bridge export`` (transitions -> Hugging Face datasets),
kept apart from ``export.py`` so the CLI builds its flags without importing pyarrow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agl_bridge.settings import check_choices, setting

ExportFormat = Literal["sft", "dpo", "prompt-completion"]
FileFormat = Literal["arrow", "parquet", "jsonl"]
Select = Literal["best", "threshold", "all"]


@dataclass
class ExportConfig:
    """What ``agl-bridge export`` writes, and from what."""

    format: ExportFormat = setting(
        "sft", help="sft: conversational examples to imitate (messages; input_ids and "
                    "completion_mask, the ids the server saw); dpo: preference pairs, chosen "
                    "and rejected from one group (same task, agent and turn, same prompt), "
                    "higher vs lower reward; prompt-completion: every transition with its "
                    "reward and advantage")
    tokenizer: str | None = setting(
        None, help="a local tokenizer or model directory: texts decoded from the token ids "
                   "(unset: messages captured in spans only, and the ids)")
    spans: str | None = setting(
        None, help="the span Parquet the transitions came from: messages captured at "
                   "AGL_BRIDGE_CAPTURE=messages make the rows conversational")
    select: Select = setting(
        "best", help="sft: the best of each group where it beats another member (best), "
                     "every transition with reward >= min_reward (threshold), or all")
    min_reward: float | None = setting(
        None, help="sft: the reward a transition (threshold) or a group's best must reach")
    margin: float = setting(
        0.0, help="dpo: a pair's chosen reward exceeds its rejected one by more than this")
    file_format: list[FileFormat] = setting(
        help="what is written in OUT: arrow (Dataset.save_to_disk, load_from_disk reads it), "
             "parquet (data.parquet), jsonl (data.jsonl)", default_factory=lambda: ["arrow"])

    def __post_init__(self) -> None:
        check_choices(self)
        if self.select == "threshold" and self.min_reward is None:
            raise ValueError("select = 'threshold' needs min_reward")
        if not self.margin >= 0:
            raise ValueError(f"margin must be 0 or more, got {self.margin!r}")
        if not self.file_format:
            raise ValueError("file_format: at least one of arrow, parquet, jsonl")
