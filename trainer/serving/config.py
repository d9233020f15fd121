"""``ServeConfig``: the serving vLLM's settings (``agl-bridge serve``, ``publish``,
``rollback``, ``aliases-serve``, the loop's ``[serve]``). ``VLLMServer`` takes the same names
as keywords, with the same defaults (a test holds them equal)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agl_bridge.settings import at_least, check_choices, setting

REGISTRY = "agl_bridge_registry"  # the registry's directory when none is given (not the loop's)


@dataclass(frozen=True)
class ServeConfig:
    registry: str | None = setting(
        None, help=f"the directory of the alias table, its history and the recorded servers "
                   f"(unset: {REGISTRY}; the loop's: WORKDIR/registry)")
    max_model_len: int | None = setting(
        None, help="the servers' context length (vLLM --max-model-len; unset: the model's own "
                   "limit, so that multi-agent histories fit)")
    max_lora_rank: int = setting(16, help="the largest LoRA rank the servers take (vLLM "
                                          "--max-lora-rank); larger adapters are refused")
    max_loras: int = setting(4, help="adapters in one batch (vLLM --max-loras)")
    kv_cache_gib: int = setting(2, help="the KV cache of the CPU backend, GiB "
                                        "(VLLM_CPU_KVCACHE_SPACE)")
    tool_call_parser: str | None = setting(
        None, help="serve agents that call tools: vLLM's --enable-auto-tool-choice with this "
                   "--tool-call-parser (hermes: Qwen2.5 and Hermes models; llama3_json: Llama "
                   "3.1 and 3.2; mistral: Mistral; docs/serving.md)")
    vllm_args: list[str] = setting(
        help="vLLM's own flags, passed as given (on the command line: after --)",
        default_factory=list)

    def __post_init__(self) -> None:
        check_choices(self)
        at_least(self, 1, "max_model_len", "max_lora_rank", "max_loras", "kv_cache_gib")

    def extra_args(self) -> list[str]:
        """The vLLM flags these settings add to those ``VLLMServer`` always passes."""
        tools = self.tool_call_parser and ["--enable-auto-tool-choice", "--tool-call-parser",
                                           self.tool_call_parser]
        return [*(tools or []), *self.vllm_args]

    def server_options(self, *extra_args: str) -> dict[str, Any]:
        """``VLLMServer``'s keywords from these settings (``extra_args``: a caller's own vLLM
        flags, before the user's)."""
        return {"max_model_len": self.max_model_len, "max_lora_rank": self.max_lora_rank,
                "max_loras": self.max_loras, "kv_cache_gib": self.kv_cache_gib,
                "extra_args": [*extra_args, *self.extra_args()]}

    @property
    def registry_dir(self) -> str:
        return self.registry or REGISTRY
