"""The trainer's one documented configuration, with the names TRL users know."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agl_bridge.settings import at_least, check_choices, setting
from agl_bridge.trainer.adapters import version_of
from agl_bridge.trainer.rewards.credit import Algorithm
from agl_bridge.trainer.rewards.normalization import Grouping, NormalizationMethod
from agl_bridge.trainer.rewards.selection import SftSelect
from agl_bridge.trainer.tracking import ReportTo

Policy = Literal["shared", "per_agent_lora", "per_agent_model"]
Objective = Literal["grpo", "sft"]
Parallelism = Literal["data", "fsdp"]
LossType = Literal["grpo", "bnpo", "dapo", "dr_grpo"]
ValueHeadInit = Literal["mean_return", "zero"]


class NothingToTrain(ValueError):
    """No transition to train on (none converted, none of ``train_agents``, none selected for
    SFT): a round with nothing to learn from, which the loop goes on after. Every other error
    is a fault and stops it."""


@dataclass(frozen=True)
class RewardNormalization:
    """Batch reward normalisation (``[train.reward_normalization]``), as the multi-turn PPO
    design's ``reward_normalization`` (RAGEN on verl): each chain's score (an agent's turns in an
    episode) normalised within its group before the critic learns it
    (``trainer/rewards/normalization.py``)."""

    grouping: Grouping = setting(
        "batch", help="the chains compared: state (the same task and agent), inductive (the "
                      "same agent over the batch) or batch (all)")
    method: NormalizationMethod = setting(
        "identity", help="identity (as they are), mean (the group's mean subtracted), mean_std "
                         "(standardised; no spread: 0) or asym_clip (mean_std clipped to [-1, "
                         "3]); other than identity it needs algorithm ppo")

    def __post_init__(self) -> None:
        check_choices(self)


@dataclass
class GRPOConfig:
    """The training stage's settings (``agl-bridge train``, ``train_from_traces``, the loop's
    ``[train]`` table). Names follow TRL's GRPOConfig (and HF TrainingArguments) where the
    concept is the same."""

    objective: Objective = setting(
        "grpo", help="grpo: the clipped policy gradient with the conversion's advantages (with "
                     "algorithm = ppo: a critic's GAE advantages); sft: supervised fine-tuning "
                     "on the transitions sft_select picks")
    policy: Policy = setting(
        "shared", help="shared: one LoRA adapter for every agent; per_agent_lora: one adapter "
                       "per agent on one base; per_agent_model: a base model per agent")
    learning_rate: float = setting(1e-4, help="AdamW learning rate")
    num_train_epochs: int = setting(
        1, help="passes over the transitions (later passes are off-policy: clipped)")
    per_device_train_batch_size: int = setting(8, help="transitions per micro-batch")
    gradient_accumulation_steps: int = setting(1, help="micro-batches per optimizer step")
    epsilon: float = setting(0.2, help="clip range, low side")
    epsilon_high: float | None = setting(None, help="clip range, high side (unset: epsilon)")
    loss_type: LossType = setting(
        "bnpo", help="grpo (sequence mean), bnpo/dapo (token mean), dr_grpo (a constant "
                     "normaliser)")
    max_completion_length: int | None = setting(
        None, help="dr_grpo's constant normaliser (unset: the longest completion in the data)")
    beta: float = setting(0.0, help="KL(policy || base) weight, k3 estimator; base = the "
                                    "adapter disabled")
    vllm_importance_sampling_correction: bool = setting(
        True, help="weight tokens by pi_old / pi_sampler (the server's logprobs)")
    vllm_importance_sampling_cap: float = setting(2.0, help="cap of that weight")
    filter_zero_variance_groups: bool = setting(
        True, help="skip groups whose rewards are all equal (nothing to learn from them)")
    lam: float = setting(
        0.95, help="ppo (algorithm = ppo): GAE's lambda (TRL's lam, verl's algorithm.lam): 1 "
                   "is the whole return with the critic as baseline, 0 the one-step TD error; "
                   "the discount is the conversion's gamma, per generated token")
    vf_coef: float = setting(
        0.1, help="ppo: weight of the value loss, loss = policy + vf_coef * value (TRL's)")
    cliprange_value: float = setting(
        0.2, help="ppo: how far a value prediction may move from its pre-update one before "
                  "the value loss is clipped (TRL's; verl's critic.cliprange_value)")
    value_head_init: ValueHeadInit = setting(
        "mean_return", help="ppo: a new value head's bias (none saved beside the version it "
                            "continues): mean_return, the mean return of its first round's "
                            "trained tokens (the critic starts on the returns' scale, which the "
                            "clipped value loss lets it reach only cliprange_value a round), or "
                            "zero")
    critic_learning_rate: float | None = setting(
        None, help="ppo: the value head's learning rate (verl's critic.optim.lr; unset: 10 x "
                   "learning_rate: the head starts from zero, the LoRA from the base)")
    rollout_filter_ratio: float = setting(
        1.0, help="keep this share of groups (rounded up), those whose rewards spread most "
                  "(standard deviation), as RAGEN's multi-turn PPO on verl (1: all)")
    reward_normalization: RewardNormalization = setting(
        help="ppo: batch reward normalisation of each chain's score before the critic learns "
             "it (the filter above reads the rewards as they were)",
        default_factory=RewardNormalization)
    max_grad_norm: float = setting(1.0, help="gradient clipping norm")
    seed: int = setting(0, help="random seed (the loop adds the round's number)")
    group_by_length: bool = setting(False, help="batches of similar length: less padding")
    share_prompts: bool = setting(
        True, help="transitions with the same prompt share a micro-batch and run the prompt "
                   "once (a mask keeps their completions apart): same gradients, fewer "
                   "positions")
    gradient_checkpointing: bool = setting(False, help="recompute activations: less memory")
    bf16: bool | None = setting(None, help="bfloat16 compute (unset: on when training on a GPU)")
    lora_r: int = setting(8, help="LoRA rank")
    lora_alpha: int = setting(16, help="LoRA alpha (scaling alpha / r)")
    lora_dropout: float = setting(0.0, help="LoRA dropout")
    lora_target_modules: list[str] = setting(
        help="the modules LoRA adapts",
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    scale_rewards_eps: float = setting(1e-4, help="added to the std when advantages are scaled")
    sft_select: SftSelect = setting(
        "best", help="sft: imitate the best of each group, or every transition with reward >= "
                     "sft_min_reward (threshold: rejection sampling)")
    sft_min_reward: float | None = setting(
        None, help="sft: the reward a transition (threshold) or a group's best must reach")
    train_agents: list[str] | None = setting(
        None, help="train only these agents' transitions (unset: all); the others' adapters "
                   "get no new version")
    parallelism: Parallelism = setting(
        "data", help="under torchrun: data (every rank holds the model; gradients averaged) or "
                     "fsdp (FSDP2: each block's weights sharded over the ranks); one process "
                     "trains the same either way")
    max_steps: int | None = setting(None, help="stop after this many optimizer steps")
    save_steps: int | None = setting(
        None, help="checkpoint every N optimizer steps (into the run's checkpoints/)")
    report_to: list[ReportTo] = setting(
        help="where settings, metrics and artifacts go, as TRL's report_to: none, all (every "
             "tool installed), mlflow (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME), "
             "tensorboard (event files in logging_dir); the loop reports its rounds there too",
        default_factory=lambda: ["none"])
    logging_dir: str | None = setting(
        None, help="TensorBoard's event files (unset: OUTPUT_DIR/runs; the loop's rounds: "
                   "WORKDIR/runs)")
    run_name: str | None = setting(
        None, help="the run's name in MLflow (unset: the output directory's; the loop's: the "
                   "workdir's)")

    def __post_init__(self) -> None:
        if isinstance(self.reward_normalization, Mapping):  # from Python, as a file gives it
            self.reward_normalization = RewardNormalization(**self.reward_normalization)
        check_choices(self)
        at_least(self, 1, "num_train_epochs", "per_device_train_batch_size",
                 "gradient_accumulation_steps", "lora_r", "lora_alpha")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate!r}")
        if self.critic_learning_rate is not None and not self.critic_learning_rate > 0:
            raise ValueError("critic_learning_rate must be positive, got "
                             f"{self.critic_learning_rate!r}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {self.lam!r}")
        if not self.vf_coef >= 0.0:
            raise ValueError(f"vf_coef must be at least 0, got {self.vf_coef!r}")
        if not 0.0 < self.rollout_filter_ratio <= 1.0:
            raise ValueError("rollout_filter_ratio must be in (0, 1], got "
                             f"{self.rollout_filter_ratio!r}")
        if not self.cliprange_value > 0.0:
            raise ValueError(f"cliprange_value must be positive, got {self.cliprange_value!r}")
        if "none" in self.report_to and len(self.report_to) > 1:
            raise ValueError(f"report_to: 'none' goes alone, got {self.report_to}")
        if self.objective == "sft" and self.sft_select == "threshold" and \
                self.sft_min_reward is None:
            raise ValueError("sft_select = 'threshold' needs sft_min_reward")


def check_algorithm(cfg: GRPOConfig, algorithm: Algorithm | None,
                    objective: Objective | None = None) -> None:
    """What the conversion's ``algorithm`` asks of the training settings, refused before
    anything runs (``train_policy``, ``train_from_traces``, the loop's file): ppo trains with
    the policy gradient; reward normalisation is for a critic's rewards (the GRPO family's
    advantages are normalised by the conversion's ``baseline`` and ``scale_advantages``)."""
    objective = objective or cfg.objective
    if algorithm == "ppo" and objective != "grpo":
        raise ValueError("algorithm ppo trains with objective grpo (the clipped policy "
                         f"gradient, with the critic's advantages), got {objective!r}")
    method = cfg.reward_normalization.method
    if algorithm != "ppo" and method != "identity":
        raise ValueError(f"reward_normalization.method = {method!r} normalises the rewards a "
                         f"critic learns: it needs algorithm ppo, got {algorithm!r} (the GRPO "
                         "family's advantages are normalised per group by the conversion's "
                         "baseline and scale_advantages)")


@dataclass
class TrainResult:
    adapters: dict[str, Path]  # adapter name -> new version directory
    steps: int
    metrics: list[dict[str, Any]]
    metrics_path: Path | None = None
    model: Any = None  # the trained peft model, when asked for (keep_model=True)
    critic: Any = None  # ppo: its value heads (critic.ValueHeads), when asked for

    @property
    def adapter_dir(self) -> Path:  # the single adapter of a shared policy
        return next(iter(self.adapters.values()))

    @property
    def version(self) -> int:
        return version_of(self.adapter_dir) or 0


