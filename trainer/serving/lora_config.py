"""An adapter's ``adapter_config.json``, read with the types a server relies on.

vLLM builds its LoRA settings from this file (``PEFTHelper``): a rank that is a string or a
bool, a pattern whose values are not ranks, or a PEFT method that is not LoRA would fail there,
or worse load with the wrong scaling. Checking it here lets publishing refuse with the file and
field named. Rank and alpha patterns follow PEFT's rule (a key matches a module name when it
matches a suffix starting at a ``.``; the first matching key wins), the rule vLLM also uses to
pick each module's rank and scaling, so the ranks checked here are the ranks a server uses.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from agl_bridge.trainer.serving.errors import PublishError

# Features a server refuses (vLLM's PEFTHelper) or that change what the adapter computes in a
# way a LoRA server does not reproduce: field -> the value that is fine.
_UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "use_dora": (False, "DoRA"),
    "lora_bias": (False, "LoRA bias"),
    "bias": ("none", "trained biases"),
    "modules_to_save": (None, "modules_to_save (fully trained modules)"),
    "layer_replication": (None, "layer_replication"),
}


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[float]:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _kind(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


@dataclass(frozen=True)
class LoraConfig:
    """The fields of a PEFT LoRA config that decide what a server loads and how it scales."""

    r: int
    lora_alpha: float
    target_modules: list[str] | str
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def _match(pattern: dict[str, Any], module: str) -> str | None:
        for key in pattern:
            if re.match(rf"(.*\.)?({key})$", module):
                return key
        return None

    def rank_for(self, module: str) -> tuple[int, str]:
        """The rank ``module`` must have, and where the config says so (for messages).
        ``module`` is its name in the checkpoint without ``base_model.model.``."""
        key = self._match(self.rank_pattern, module)
        if key is None:
            return self.r, f"r={self.r}"
        return self.rank_pattern[key], f"rank_pattern[{key!r}]={self.rank_pattern[key]}"

    def pattern_keys_matching(self, modules: list[str]) -> set[tuple[str, str]]:
        """(pattern, key) of the rank/alpha pattern keys that some module matches."""
        out = set()
        for name, pattern in (("rank_pattern", self.rank_pattern),
                              ("alpha_pattern", self.alpha_pattern)):
            for module in modules:
                key = self._match(pattern, module)
                if key is not None:
                    out.add((name, key))
        return out

    @property
    def max_rank(self) -> tuple[int, str]:
        """The largest rank the config asks for, and where."""
        best = (self.r, f"r={self.r}")
        for key, rank in self.rank_pattern.items():
            if rank > best[0]:
                best = (rank, f"rank_pattern[{key!r}]={rank}")
        return best


def _pattern(raw: dict[str, Any], name: str, where: Path, *, rank: bool) -> dict[str, Any]:
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PublishError(f"{where}: {name} is {_kind(value)}, not an object")
    for key, v in value.items():
        try:
            re.compile(key)
        except re.error as exc:
            raise PublishError(f"{where}: {name} key {key!r} is not a valid pattern "
                               f"({exc})") from None
        if rank and not (_is_int(v) and v > 0):
            raise PublishError(f"{where}: {name}[{key!r}] is {_kind(v)}, not a positive "
                               f"integer rank")
        if not rank and not _is_number(v):
            raise PublishError(f"{where}: {name}[{key!r}] is {_kind(v)}, not a number")
    return dict(value)


def parse_lora_config(raw: Any, where: Path) -> LoraConfig:
    """Check a parsed ``adapter_config.json`` (``where`` names it in messages)."""
    if not isinstance(raw, dict):
        raise PublishError(f"{where}: a JSON {type(raw).__name__}, not an object")
    peft_type = raw.get("peft_type")
    if peft_type != "LORA":
        raise PublishError(f"{where}: peft_type is {peft_type!r}; only LoRA adapters "
                           f"(\"LORA\") can be served")
    r = raw.get("r")
    if not (_is_int(r) and r > 0):
        raise PublishError(f"{where}: r is {_kind(r)}, not a positive integer")
    alpha = raw.get("lora_alpha")
    if not _is_number(alpha):
        raise PublishError(f"{where}: lora_alpha is {_kind(alpha)}, not a number")
    targets = raw.get("target_modules")
    names = isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)
    if not (names or (isinstance(targets, str) and targets)):
        raise PublishError(f"{where}: target_modules is {_kind(targets)}, not a list of "
                           f"module names or a pattern")
    for name, (fine, what) in _UNSUPPORTED.items():
        value = raw.get(name, fine)
        if value != fine and not (fine is None and value in ([], {})):
            raise PublishError(f"{where}: {name} is {value!r}: {what} cannot be served as a "
                               f"LoRA adapter")
    return LoraConfig(r=r, lora_alpha=float(alpha),
                      target_modules=targets if isinstance(targets, str) else list(targets or ()),
                      rank_pattern=_pattern(raw, "rank_pattern", where, rank=True),
                      alpha_pattern=_pattern(raw, "alpha_pattern", where, rank=False))
