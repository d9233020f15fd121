"""Supervised fine-tuning from traces: which transitions to imitate, and the loss.

Rejection-sampling fine-tuning keeps the rollouts that went well and trains the policy to
produce them again, with no advantage and no clipping; which ones went well is
``rewards/selection.py``'s rule (``best``, ``threshold``), shared with ``agl-bridge export``.

Pure functions of arrays, checked on tables in ``tests/trainer/training/test_sft.py``.
"""

from __future__ import annotations

import torch

from agl_bridge.trainer.rewards.selection import select_for_sft
from agl_bridge.trainer.training.config import LossType
from agl_bridge.trainer.training.losses import aggregate

__all__ = ["select_for_sft", "sft_loss"]


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, loss_type: LossType = "bnpo",
             max_completion_length: int | None = None) -> torch.Tensor:
    """Negative log-likelihood of the completion tokens in ``mask`` [B, T], averaged as
    ``loss_type`` says (``bnpo``: over the batch's tokens; ``grpo``: per sequence first)."""
    return aggregate(-logprobs, mask, loss_type, max_completion_length)
