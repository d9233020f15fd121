"""Adapter directories written byte by byte (no torch, no training): a valid PEFT LoRA adapter
for a 64-wide model, and the pieces to break one in exactly one way.

``write_adapter(d)`` writes ``adapter_config.json`` and ``adapter_model.safetensors`` for
q/k/v/o projections of one layer at rank 8; ``config`` overrides config fields, ``tensors``
replaces the tensors (name -> (dtype, shape)), ``weights`` replaces the file's bytes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "U8": 1}
MODULES = [f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"]
HIDDEN = 64


def lora_tensors(rank: int = 8, modules: list[str] = MODULES, dtype: str = "F32",
                 ranks: dict[str, int] | None = None) -> dict[str, tuple[str, list[int]]]:
    """A/B pairs: A is [r, in], B is [out, r] (``ranks`` overrides per module)."""
    out = {}
    for m in modules:
        r = (ranks or {}).get(m, rank)
        out[f"base_model.model.{m}.lora_A.weight"] = (dtype, [r, HIDDEN])
        out[f"base_model.model.{m}.lora_B.weight"] = (dtype, [HIDDEN, r])
    return out


def header_of(tensors: dict[str, tuple[str, list[int]]]) -> tuple[dict[str, Any], int]:
    """A consistent header for ``tensors`` (laid out back to back) and its data length."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = math.prod(shape) * BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    return header, offset


def safetensors_bytes(header: Any, data_len: int, *, raw_header: bytes | None = None) -> bytes:
    raw = raw_header if raw_header is not None else json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + bytes(data_len)


def config(**overrides: Any) -> dict[str, Any]:
    base = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "bias": "none",
            "rank_pattern": {}, "alpha_pattern": {}, "use_dora": False,
            "modules_to_save": None}
    base.update(overrides)
    return base


def write_adapter(d: Path, *, config_overrides: dict[str, Any] | None = None,
                  config_text: str | None = None,
                  tensors: dict[str, tuple[str, list[int]]] | None = None,
                  weights: bytes | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "adapter_config.json").write_text(
        config_text if config_text is not None else json.dumps(config(**(config_overrides
                                                                          or {}))))
    if weights is None:
        weights = safetensors_bytes(*header_of(tensors if tensors is not None
                                               else lora_tensors()))
    (d / "adapter_model.safetensors").write_bytes(weights)
    return d
