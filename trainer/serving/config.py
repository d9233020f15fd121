"""``ServeConfig``: the serving vLLM's settings (``agl-bridge serve``, ``publish``,
``rollback``, ``aliases-serve``, the loop's ``[serve]``). ``VLLMServer`` takes the same names
as keywords, with the same defaults (a test holds them equal)."""

from __future__ import annotations

from dataclasses import dataclass

from agl_bridge.settings import check_choices, setting

REGISTRY = "agl_bridge_registry"  # the registry's directory when none is given (not the loop's)


@dataclass(frozen=True)
class ServeConfig:
    registry: str | None = setting(
        None, help=f"the directory of the alias table, its history and the recorded servers "
                   f"(unset: {REGISTRY}; the loop's: WORKDIR/registry)")
    max_model_len: int = setting(1024, help="the servers' context length (vLLM "
                                            "--max-model-len)")
    max_lora_rank: int = setting(16, help="the largest LoRA rank the servers take (vLLM "
                                          "--max-lora-rank); larger adapters are refused")
    max_loras: int = setting(4, help="adapters in one batch (vLLM --max-loras)")
    kv_cache_gib: int = setting(2, help="the KV cache of the CPU backend, GiB "
                                        "(VLLM_CPU_KVCACHE_SPACE)")

    def __post_init__(self) -> None:
        check_choices(self)
        for name in ("max_model_len", "max_lora_rank", "max_loras", "kv_cache_gib"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")

    @property
    def registry_dir(self) -> str:
        return self.registry or REGISTRY
