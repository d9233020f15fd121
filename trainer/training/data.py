"""Transitions -> micro-batches: reading, batching (optionally by length), collation."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from agl_bridge.parquet_io import read_checked
from agl_bridge.schema import REQUIRED_TRANSITION_COLUMNS


def read_transitions(path: str | os.PathLike[str]) -> pa.Table:
    return read_checked(Path(path), REQUIRED_TRANSITION_COLUMNS)


def batches(indices: list[int], size: int, rng: random.Random, lengths: list[int] | None
             ) -> list[list[int]]:
    order = list(indices)
    rng.shuffle(order)
    if lengths is not None:  # similar lengths together, batch order still shuffled
        order.sort(key=lambda i: lengths[i])
        batches = [order[i:i + size] for i in range(0, len(order), size)]
        rng.shuffle(batches)
        return batches
    return [order[i:i + size] for i in range(0, len(order), size)]


def collate(rows: list[dict[str, Any]], pad_id: int, device: torch.device
             ) -> dict[str, torch.Tensor]:
    """Right-padded prompt+completion; ``targets`` and ``loss_mask`` cover completion tokens;
    ``behaviour`` holds the sampler's logprobs where known (``has_behaviour``)."""
    seqs = [r["prompt_ids"] + r["completion_ids"] for r in rows]
    width = max(len(s) for s in seqs)
    comp_width = max(len(r["completion_ids"]) for r in rows)
    b = len(rows)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    positions = torch.zeros((b, comp_width), dtype=torch.long)  # logits predicting token j
    targets = torch.full((b, comp_width), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((b, comp_width), dtype=torch.float32)
    behaviour = torch.zeros((b, comp_width), dtype=torch.float32)
    has_behaviour = torch.zeros((b, comp_width), dtype=torch.float32)
    for i, (r, s) in enumerate(zip(rows, seqs)):
        p, c = len(r["prompt_ids"]), len(r["completion_ids"])
        input_ids[i, : len(s)] = torch.tensor(s)
        attention[i, : len(s)] = 1
        positions[i, :c] = torch.arange(p - 1, p - 1 + c)
        targets[i, :c] = torch.tensor(r["completion_ids"])
        loss_mask[i, :c] = torch.tensor(r["completion_mask"], dtype=torch.float32)
        if r.get("behaviour_logprobs") is not None:
            behaviour[i, :c] = torch.tensor(r["behaviour_logprobs"], dtype=torch.float32)
            has_behaviour[i, :c] = 1.0
    out = {"input_ids": input_ids, "attention_mask": attention, "positions": positions,
           "targets": targets, "loss_mask": loss_mask, "behaviour": behaviour,
           "has_behaviour": has_behaviour}
    return {k: v.to(device) for k, v in out.items()}


