"""Transitions -> micro-batches: reading, batching (optionally by length or by shared prompt),
collation (one row per sequence, or sequences that share a prompt packed into one row)."""

from __future__ import annotations

import os
import random
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from agl_bridge.parquet_io import read_checked
from agl_bridge.schema import REQUIRED_TRANSITION_COLUMNS


def read_transitions(path: str | os.PathLike[str]) -> pa.Table:
    """A transitions file, or a directory of them (the parts of a conversion on several
    machines, ``convert(part=...)``), in name order."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.name.endswith(".parquet"))
        if not files:
            raise FileNotFoundError(f"{p}: no transitions files (*.parquet) in it")
        return pa.concat_tables([read_checked(f, REQUIRED_TRANSITION_COLUMNS) for f in files])
    return read_checked(p, REQUIRED_TRANSITION_COLUMNS)


def batches(indices: list[int], size: int, rng: random.Random, lengths: list[int] | None,
            keys: Sequence[Hashable] | None = None) -> list[list[int]]:
    """Micro-batches of ``size`` indices in shuffled order.

    ``lengths``: similar lengths together (less padding), batch order still shuffled.
    ``keys`` (one per index in the whole table, e.g. the prompt): indices with the same key stay
    next to each other, so a GRPO group lands in one micro-batch (or two adjacent ones when the
    batch size is not a multiple of the group's), which is what lets ``collate`` run the shared
    prompt once. The units are shuffled, not their members' batches' contents.
    """
    if keys is None:
        order = list(indices)
        rng.shuffle(order)
        units = [[i] for i in order]
    else:
        by_key: dict[Hashable, list[int]] = {}
        for i in indices:
            by_key.setdefault(keys[i], []).append(i)
        units = list(by_key.values())
        rng.shuffle(units)
    if lengths is not None:
        units.sort(key=lambda u: lengths[u[0]])
    order = [i for u in units for i in u]
    out = [order[i:i + size] for i in range(0, len(order), size)]
    if lengths is not None:
        rng.shuffle(out)
    return out


def row_cost(length: int, hidden_size: int) -> float:
    """Relative cost of one row of ``length`` positions through a decoder: per position the
    projections and MLP (about 24 h^2 multiply-adds a layer for a Llama-shaped block) and the
    attention over the row (about 4 h L), i.e. L + L^2 / (6 h) in units of a position's
    linear work. Only the comparison of two layouts of the same micro-batch uses it."""
    return length + length * length / (6.0 * max(1, hidden_size))


def pack_rows(prompts: Sequence[Sequence[int]], completion_lengths: Sequence[int],
              hidden_size: int, max_row: int | None = None) -> list[list[int]] | None:
    """Which sequences of a micro-batch share a row, or None for one row per sequence.

    Sequences with the same prompt (a GRPO group, tree-sampling candidates) can run it once:
    ``[prompt, completion 1, completion 2, ...]`` with a mask that lets each completion see the
    prompt and itself only, and positions restarting after the prompt, gives every completion
    token the same log-probability as its own row would. Packing pays when the prompt is long
    next to the completions; with short prompts and long completions the longer rows' attention
    costs more than it saves, and the padded width of the batch counts for both layouts, so the
    layout is chosen by ``row_cost`` over the whole micro-batch. ``max_row`` (a sliding-window
    model's window) bounds a packed row's length.
    """
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        by_prompt.setdefault(tuple(p), []).append(i)
    if len(by_prompt) == len(prompts):
        return None
    rows = list(by_prompt.values())
    lengths = [len(prompts[r[0]]) + sum(completion_lengths[i] for i in r) for r in rows]
    if max_row is not None and max(lengths) > max_row:
        return None
    single = max(len(p) + c for p, c in zip(prompts, completion_lengths))
    packed_cost = len(rows) * row_cost(max(lengths), hidden_size)
    if packed_cost >= len(prompts) * row_cost(single, hidden_size):
        return None
    return rows


def collate(rows: list[dict[str, Any]], pad_id: int, device: torch.device,
            packing: list[list[int]] | None = None, mask_dtype: torch.dtype = torch.float32
            ) -> dict[str, torch.Tensor]:
    """Model inputs for a micro-batch; ``targets`` and ``loss_mask`` cover completion tokens
    ([B, C], one row per transition in the order given); ``index`` [B, C] says which flattened
    position of the model's output predicts each target; ``behaviour`` holds the sampler's
    logprobs where known (``has_behaviour``).

    Without ``packing``: one right-padded row per transition with a 2-D padding mask. With it
    (from ``pack_rows``): one row per list, the shared prompt once, then each completion, with
    ``position_ids`` and a 4-D additive ``attention_mask`` (0 where a position may attend,
    the dtype's minimum elsewhere; padding attends to itself, so no row of the softmax is
    empty) in ``mask_dtype``, the model's dtype.
    """
    b = len(rows)
    comp_width = max(len(r["completion_ids"]) for r in rows)
    targets = torch.full((b, comp_width), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((b, comp_width), dtype=torch.float32)
    behaviour = torch.zeros((b, comp_width), dtype=torch.float32)
    has_behaviour = torch.zeros((b, comp_width), dtype=torch.float32)
    index = torch.zeros((b, comp_width), dtype=torch.long)
    for i, r in enumerate(rows):
        c = len(r["completion_ids"])
        targets[i, :c] = torch.tensor(r["completion_ids"])
        loss_mask[i, :c] = torch.tensor(r["completion_mask"], dtype=torch.float32)
        if r.get("behaviour_logprobs") is not None:
            behaviour[i, :c] = torch.tensor(r["behaviour_logprobs"], dtype=torch.float32)
            has_behaviour[i, :c] = 1.0
    out = {"targets": targets, "loss_mask": loss_mask, "behaviour": behaviour,
           "has_behaviour": has_behaviour}
    if packing is None:
        seqs = [r["prompt_ids"] + r["completion_ids"] for r in rows]
        width = max(len(s) for s in seqs)
        input_ids = torch.full((b, width), pad_id, dtype=torch.long)
        attention = torch.zeros((b, width), dtype=torch.long)
        for i, (r, s) in enumerate(zip(rows, seqs)):
            p, c = len(r["prompt_ids"]), len(r["completion_ids"])
            input_ids[i, : len(s)] = torch.tensor(s)
            attention[i, : len(s)] = 1
            index[i, :c] = torch.arange(i * width + p - 1, i * width + p - 1 + c)
        out |= {"input_ids": input_ids, "attention_mask": attention, "index": index}
        return {k: v.to(device) for k, v in out.items()}

    if sorted(i for row in packing for i in row) != list(range(b)):
        raise ValueError(f"packing must place each of the {b} sequences once, got {packing}")
    width = max(len(rows[row[0]]["prompt_ids"]) + sum(len(rows[i]["completion_ids"])
                                                       for i in row) for row in packing)
    n_rows = len(packing)
    input_ids = torch.full((n_rows, width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((n_rows, width), dtype=torch.long)
    segment = torch.full((n_rows, width), -2, dtype=torch.long)  # -1 prompt, k completion k
    for j, row in enumerate(packing):
        prompt = rows[row[0]]["prompt_ids"]
        if any(rows[i]["prompt_ids"] != prompt for i in row):
            raise ValueError(f"packed row {j} holds sequences with different prompts")
        p = len(prompt)
        input_ids[j, :p] = torch.tensor(prompt)
        position_ids[j, :p] = torch.arange(p)
        segment[j, :p] = -1
        at = p
        for k, i in enumerate(row):
            comp = rows[i]["completion_ids"]
            c = len(comp)
            input_ids[j, at:at + c] = torch.tensor(comp)
            position_ids[j, at:at + c] = torch.arange(p, p + c)
            segment[j, at:at + c] = k
            # the first token is predicted by the prompt's last position, then by its own
            index[i, 0] = j * width + p - 1
            index[i, 1:c] = torch.arange(j * width + at, j * width + at + c - 1)
            at += c
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    query, key = segment[:, :, None], segment[:, None, :]
    allowed = causal & ((query == key) & (query != -2) | (key == -1) & (query >= -1))
    allowed |= torch.eye(width, dtype=torch.bool)  # padding sees itself: no empty softmax row
    mask = torch.zeros((n_rows, 1, width, width), dtype=mask_dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(mask_dtype).min)
    out |= {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids,
            "index": index}
    return {k: v.to(device) for k, v in out.items()}
