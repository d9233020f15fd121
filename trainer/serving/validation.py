"""Refuse an adapter that would fail, or quietly misbehave, once served: before any server or
agent sees it, and from what the files hold, not only from what the config says.

Checked in the order a loader meets them (vLLM does the same where it loads adapters:
``vllm/lora/peft_helper.py`` for the config, ``lora_model.py`` and ``utils.py`` for the
tensors), so the first refusal is the most basic problem:

1. the directory, ``adapter_config.json`` as JSON, and safetensors weights (a pickled ``.bin``
   or ``.pt`` can run code when loaded: refused before anything reads it);
2. the config's fields and types (``lora_config``), and its largest rank against the servers'
   ``--max-lora-rank``;
3. the safetensors header against the format and the file (``safetensors_header``);
4. the tensors: only LoRA weights, in A/B pairs whose shapes give one rank (A is
   ``[r, in]``, B is ``[out, r]``) that is the rank the config gives that module (``r`` or
   its ``rank_pattern``); every pattern key describes some module of these weights. A config
   saying ``r=8`` over rank-64 tensors would otherwise pass the rank limit and fail, or scale
   wrongly, in the server;
5. with a base model: our metadata's base fingerprint, and each pair's outer dimensions
   against the base weight it adapts.

Every refusal is a ``PublishError`` naming the file and the problem.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agl_bridge.trainer.adapters import METADATA_FILE, base_model_fingerprint, read_metadata
from agl_bridge.trainer.serving.errors import PublishError
from agl_bridge.trainer.serving.lora_config import LoraConfig, parse_lora_config
from agl_bridge.trainer.serving.safetensors_header import (
    FLOAT_DTYPES,
    HeaderError,
    TensorInfo,
    read_header,
)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

# PEFT's names: <module>.lora_A.weight / lora_B.weight for linear layers,
# <module>.lora_embedding_A / _B for embeddings (vllm/lora/utils.py parses the same)
_LORA_NAME = re.compile(r"(?:base_model\.model\.)?(?P<module>.+?)\."
                        r"(?:lora_(?P<linear>[AB])\.weight|lora_embedding_(?P<embedding>[AB]))")


@dataclass
class LoraPair:
    """One adapted module: its A and B tensors."""

    module: str
    embedding: bool
    a: TensorInfo | None = None
    b: TensorInfo | None = None


def _read_config(d: Path) -> dict[str, Any]:
    """The config as JSON, read only from a regular file of at most 1 MiB: a link to
    ``/dev/zero`` grew the publisher until the OOM killer came, a FIFO hung it."""
    from agl_bridge.settings import SettingError, read_text

    path = d / CONFIG_FILE
    if not path.exists() and not path.is_symlink():
        raise PublishError(f"{d}: not a PEFT adapter (no {CONFIG_FILE})")
    try:
        return json.loads(read_text(path, "adapter config"))
    except SettingError as exc:
        raise PublishError(str(exc)) from None
    except (ValueError, RecursionError) as exc:
        raise PublishError(f"{path}: not valid JSON ({exc})") from None


def _weights_file(d: Path) -> Path:
    weights = d / WEIGHTS_FILE
    if not weights.exists():
        if list(d.glob("*.bin")) or list(d.glob("*.pt")):
            raise PublishError(f"{d}: weights are not safetensors (a pickled .bin/.pt can run "
                               f"code when loaded); save them with safe_serialization=True")
        raise PublishError(f"{d}: missing {WEIGHTS_FILE}")
    return weights


def _header(path: Path) -> dict[str, TensorInfo]:
    try:
        return read_header(path)
    except (OSError, HeaderError) as exc:
        raise PublishError(f"{path}: corrupt safetensors file ({exc})") from None


def lora_pairs(weights: Path, tensors: dict[str, TensorInfo]) -> list[LoraPair]:
    """Group the tensors into A/B pairs by module; refuse anything that is not a LoRA weight
    or a pair missing a half."""
    if not tensors:
        raise PublishError(f"{weights}: holds no tensors, so no LoRA weights")
    pairs: dict[str, LoraPair] = {}
    for name, info in tensors.items():
        m = _LORA_NAME.fullmatch(name)
        if not m:
            raise PublishError(f"{weights}: tensor {name!r} is not a LoRA weight (expected "
                               f"<module>.lora_A.weight / lora_B.weight)")
        embedding = m.group("embedding") is not None
        pair = pairs.setdefault(m.group("module"), LoraPair(m.group("module"), embedding))
        if pair.embedding != embedding:
            raise PublishError(f"{weights}: {pair.module} has both linear and embedding LoRA "
                               f"weights")
        if (m.group("linear") or m.group("embedding")) == "A":
            pair.a = info
        else:
            pair.b = info
    for pair in pairs.values():
        if pair.a is None or pair.b is None:
            have, lack = ("A", "B") if pair.b is None else ("B", "A")
            raise PublishError(f"{weights}: {pair.module} has lora_{have} but no lora_{lack}")
    return [pairs[k] for k in sorted(pairs)]


def _check_ranks(weights: Path, config_path: Path, config: LoraConfig,
                 pairs: list[LoraPair]) -> None:
    """The rank of each pair, from its shapes, against its partner and the config."""
    for p in pairs:
        assert p.a is not None and p.b is not None
        for t in (p.a, p.b):
            if t.dtype not in FLOAT_DTYPES:
                raise PublishError(f"{weights}: {t.name} is {t.dtype}, not a floating-point "
                                   f"dtype")
            if len(t.shape) != 2:
                raise PublishError(f"{weights}: {t.name} has shape {list(t.shape)}, not a "
                                   f"matrix")
        rank_a, rank_b = p.a.shape[0], p.b.shape[1]
        if rank_a != rank_b:
            raise PublishError(f"{weights}: {p.module}: lora_A {list(p.a.shape)} has rank "
                               f"{rank_a} but lora_B {list(p.b.shape)} has rank {rank_b}")
        want, source = config.rank_for(p.module)
        if rank_a != want:
            raise PublishError(f"{weights}: {p.module} has rank {rank_a} in its tensors but "
                               f"{config_path.name} says {source}")
    used = config.pattern_keys_matching([p.module for p in pairs])
    for name, pattern in (("rank_pattern", config.rank_pattern),
                          ("alpha_pattern", config.alpha_pattern)):
        for key in pattern:
            if (name, key) not in used:
                raise PublishError(f"{config_path}: {name} key {key!r} matches no module of "
                                   f"{weights.name}: config and weights disagree")


def _check_base(d: Path, base: Path, pairs: list[LoraPair]) -> None:
    """The adapter fits the base model being served: fingerprint, then shapes."""
    try:
        meta = read_metadata(d) or {}
    except (ValueError, RecursionError) as exc:
        raise PublishError(f"{d / METADATA_FILE}: not valid metadata ({exc})") from None
    trained_on = meta.get("base_model_fingerprint")
    try:
        serving = base_model_fingerprint(base)
    except OSError as exc:
        raise PublishError(f"{base}: not a model directory ({exc})") from None
    if trained_on and trained_on != serving:
        raise PublishError(f"{d}: trained on another base model (fingerprint "
                           f"{str(trained_on)[:12]}..., serving {base})")
    base_shapes: dict[str, tuple[int, ...]] = {}
    for f in sorted(base.glob("*.safetensors")):
        base_shapes.update({k: t.shape for k, t in _header(f).items()})
    for p in pairs:
        assert p.a is not None and p.b is not None
        target = base_shapes.get(f"{p.module}.weight")
        if target is None or len(target) != 2:
            raise PublishError(f"{d}: adapts {p.module}, which the base model {base} "
                               f"does not have: trained for another model")
        # linear weight [out, in]: A is [r, in], B is [out, r];
        # embedding weight [vocab, dim]: A is [r, vocab], B is [dim, r]
        a_dim, b_dim = (target[0], target[1]) if p.embedding else (target[1], target[0])
        for t, dim, want in ((p.a, p.a.shape[1], a_dim), (p.b, p.b.shape[0], b_dim)):
            if dim != want:
                raise PublishError(f"{d}: {t.name} has shape {list(t.shape)}, which does not "
                                   f"fit {p.module} {list(target)} of the base model: trained "
                                   f"for another model")


def validate_adapter(adapter_dir: str | os.PathLike[str], *,
                     base_model: str | os.PathLike[str] | None = None,
                     max_lora_rank: int | None = None) -> dict[str, Any]:
    """Refuse an adapter that would fail, or quietly misbehave, once served. Returns its
    config (the parsed ``adapter_config.json``)."""
    d = Path(adapter_dir)
    if not d.is_dir():
        raise PublishError(f"{d}: no such adapter directory")
    raw = _read_config(d)
    weights = _weights_file(d)
    config_path = d / CONFIG_FILE
    config = parse_lora_config(raw, config_path)
    rank, source = config.max_rank
    if max_lora_rank is not None and rank > max_lora_rank:
        raise PublishError(f"{config_path}: LoRA rank {rank} is above the servers' "
                           f"--max-lora-rank {max_lora_rank} ({source})")
    pairs = lora_pairs(weights, _header(weights))
    _check_ranks(weights, config_path, config, pairs)
    if base_model is not None:
        _check_base(d, Path(base_model), pairs)
    return raw
