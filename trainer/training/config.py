"""The trainer's one documented configuration, with the names TRL users know."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agl_bridge.trainer.adapters import version_of

Policy = Literal["shared", "per_agent_lora", "per_agent_model"]
POLICIES: tuple[Policy, ...] = ("shared", "per_agent_lora", "per_agent_model")
# grpo: sequence mean; bnpo/dapo: token mean; dr_grpo: a constant normaliser (TRL's names)
Parallelism = Literal["data", "fsdp"]
PARALLELISMS: tuple[Parallelism, ...] = ("data", "fsdp")
LossType = Literal["grpo", "bnpo", "dapo", "dr_grpo"]
# what train_from_traces, the CLI and the loop train with: a credit assignment
# (trainer/rewards/credit.py's ALGORITHMS) or supervised fine-tuning
TRAIN_ALGORITHMS: tuple[str, ...] = ("at_grpo", "lightning_rl", "sft")

# what SFT imitates: the best of each group, or every transition above a reward
SftSelect = Literal["best", "threshold"]
SFT_SELECTS: tuple[SftSelect, ...] = ("best", "threshold")


def one_of(names: tuple[str, ...]) -> str:
    """``a, b or c``: the choices as an error message names them."""
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


@dataclass
class GRPOConfig:
    """Names follow TRL's GRPOConfig (and HF TrainingArguments) where the concept is the same."""

    learning_rate: float = 1e-4
    num_train_epochs: int = 1  # passes over the transitions (later passes are off-policy: clip)
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    epsilon: float = 0.2  # clip range low
    epsilon_high: float | None = None  # clip range high (defaults to epsilon)
    loss_type: LossType = "bnpo"  # grpo (sequence mean), bnpo/dapo (token mean), dr_grpo
    max_completion_length: int | None = None  # dr_grpo's constant; default: longest in data
    beta: float = 0.0  # KL(policy || base) weight, k3 estimator; base = adapter disabled
    vllm_importance_sampling_correction: bool = True  # weight by pi_old / pi_sampler
    vllm_importance_sampling_cap: float = 2.0
    filter_zero_variance_groups: bool = True  # nothing to learn from them: skip the compute
    max_grad_norm: float = 1.0
    seed: int = 0
    group_by_length: bool = False  # batches of similar length: less padding
    # transitions with the same prompt (a GRPO group, tree-sampling candidates) share a
    # micro-batch and run the prompt once, in one row with a mask that keeps their completions
    # apart: the same log-probabilities and gradients for fewer positions (data.pack_rows)
    share_prompts: bool = True
    gradient_checkpointing: bool = False
    bf16: bool | None = None  # default: on when training on a GPU
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    scale_rewards_eps: float = 1e-4
    # SFT (train_policy(objective="sft"), algorithm="sft"): which transitions to imitate:
    # "best" of each group, or every one with reward >= sft_min_reward ("threshold")
    sft_select: SftSelect = "best"
    sft_min_reward: float | None = None
    # train only these agents' transitions (None: all); the others' adapters get no new version
    train_agents: list[str] | None = None
    # under torchrun: "data" (every rank holds the whole model; gradients averaged) or "fsdp"
    # (PyTorch FSDP2: each decoder block's weights sharded over the ranks, gathered while the
    # block runs; bfloat16 compute on GPU unless bf16=False; sharded checkpoints). One process:
    # the same training either way.
    parallelism: Parallelism = "data"
    max_steps: int | None = None  # stop after this many optimizer steps
    save_steps: int | None = None  # checkpoint every N optimizer steps (needs checkpoint_dir)


@dataclass
class TrainResult:
    adapters: dict[str, Path]  # adapter name -> new version directory
    steps: int
    metrics: list[dict[str, Any]]
    metrics_path: Path | None = None
    model: Any = None  # the trained peft model, when asked for (keep_model=True)

    @property
    def adapter_dir(self) -> Path:  # the single adapter of a shared policy
        return next(iter(self.adapters.values()))

    @property
    def version(self) -> int:
        return version_of(self.adapter_dir) or 0


