"""Policy-gradient pieces as pure tensor functions, each checkable against a hand computation.

Names follow TRL's ``GRPOTrainer`` where the concept is the same: ``epsilon`` / ``epsilon_high``
(clip range), ``loss_type`` (how token losses are averaged), ``beta`` (KL weight),
``vllm_importance_sampling_cap`` (truncated importance sampling against the sampler); and
TRL's ``PPOTrainer`` for the critic's (``cliprange_value``, ``vf_coef``).
"""

from __future__ import annotations

import torch

from agl_bridge.trainer.training.config import LossType


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position without building a full-vocabulary log-softmax tensor.

    ``logits``: [..., V] for the positions that predict ``targets`` [...].
    """
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()
    return picked - torch.logsumexp(logits.float(), dim=-1)


class _LinearTokenLogprobs(torch.autograd.Function):
    """log p(target) of ``hidden @ weight.T + bias`` in tiles of rows; logits are recomputed in
    backward, never kept. Forward and backward each hold one [rows, V] tile at a time."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, rows: int):
        acc = torch.promote_types(hidden.dtype, torch.float32)
        n = hidden.size(0)
        out = torch.empty(n, dtype=acc, device=hidden.device)
        lse = torch.empty(n, dtype=acc, device=hidden.device)
        for s in range(0, n, rows):
            e = min(n, s + rows)
            logits = torch.nn.functional.linear(hidden[s:e], weight, bias).to(acc)
            lse[s:e] = torch.logsumexp(logits, dim=-1)
            out[s:e] = logits.gather(-1, targets[s:e, None]).squeeze(-1) - lse[s:e]
            del logits
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.rows = rows
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros_like(bias) if need_bias and bias is not None else None
        grad = grad.to(lse.dtype)
        n, rows = hidden.size(0), ctx.rows
        for s in range(0, n, rows):
            e = min(n, s + rows)
            logits = torch.nn.functional.linear(hidden[s:e], weight, bias).to(lse.dtype)
            # d log p_t / d z = onehot(t) - softmax(z), in place on the recomputed tile
            g = logits.sub_(lse[s:e, None]).exp_().mul_(-grad[s:e, None])
            g.scatter_add_(-1, targets[s:e, None], grad[s:e, None])
            g = g.to(hidden.dtype)
            if grad_hidden is not None:
                torch.mm(g, weight, out=grad_hidden[s:e])
            if grad_weight is not None:
                grad_weight.addmm_(g.t(), hidden[s:e])
            if grad_bias is not None:
                grad_bias.add_(g.sum(0))
            del logits, g
        return grad_hidden, grad_weight, grad_bias, None, None


def linear_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          bias: torch.Tensor | None = None, *,
                          tile_bytes: int | None = None) -> torch.Tensor:
    """``token_logprobs(hidden @ weight.T + bias, targets)`` for ``hidden`` [N, H], ``targets``
    [N], without a [N, V] logits tensor in forward or backward.

    The LM head runs on tiles of rows of about ``tile_bytes`` of logits (default 8 MiB on the
    CPU, 256 MiB on an accelerator) and is recomputed in backward (one more head matmul, a few
    percent of a step), so no vocabulary-sized tensor of the whole batch is ever alive: saved
    for backward are only ``hidden`` and one log-normaliser per row. Returns float32 (float64
    for float64 input), like ``token_logprobs``.
    """
    if tile_bytes is None:
        tile_bytes = (8 if hidden.device.type == "cpu" else 256) << 20
    rows = max(1, tile_bytes // (4 * weight.size(0)))
    # contiguous: backward writes each tile's gradient into row slices of one buffer
    return _LinearTokenLogprobs.apply(hidden.contiguous(), weight, bias, targets.contiguous(),
                                      rows)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: LossType,
              max_completion_length: int | None = None) -> torch.Tensor:
    """Average token losses [B, T] over the tokens in ``mask``.

    ``grpo``: mean over each sequence's tokens, then over sequences (long answers count no more
    than short ones, but each token of a short one counts more). ``bnpo``/``dapo``: mean over all
    tokens of the batch. ``dr_grpo``: sum over tokens divided by the constant
    ``B * max_completion_length`` (Dr. GRPO: no length bias at all).
    """
    mask = mask.to(per_token.dtype)
    if loss_type == "grpo":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.mean()
    if loss_type in ("bnpo", "dapo"):
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        length = max_completion_length or per_token.size(-1)
        return (per_token * mask).sum() / (per_token.size(0) * length)
    raise ValueError(f"loss_type must be grpo, bnpo, dapo or dr_grpo, got {loss_type!r}")


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate k3 = exp(r - p) - (r - p) - 1 >= 0 (Schulman).

    Zero exactly where the policy equals the reference (before the first update).
    """
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def importance_weights(old_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor,
                       cap: float) -> torch.Tensor:
    """Truncated importance weights min(pi_old / pi_sampler, cap), per token, no gradient.

    The sampler (vLLM, maybe in another precision or with another kernel) and the trainer see
    slightly different probabilities; weighting by their ratio keeps the update on-policy for
    the trainer's model, and the cap bounds the variance.
    """
    with torch.no_grad():
        return torch.exp(old_logprobs - behaviour_logprobs).clamp(max=cap)


def grpo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    loss_type: LossType = "bnpo",
    max_completion_length: int | None = None,
    beta: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clipped policy-gradient loss with optional KL penalty and importance weights.

    ``logprobs``/``old_logprobs``/``mask`` (and ``ref_logprobs``, ``weights``): [B, T];
    ``advantages``: [B], one per sequence (GRPO), or [B, T], one per token (PPO's GAE).
    Returns the loss and float statistics.
    """
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    adv = (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages).to(logprobs.dtype)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - epsilon_low, 1.0 + epsilon_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * weights
    kl = None
    if beta != 0.0:
        if ref_logprobs is None:
            raise ValueError("beta != 0 needs ref_logprobs")
        kl = kl_k3(logprobs, ref_logprobs)
        per_token = per_token + beta * kl
    loss = aggregate(per_token, mask, loss_type, max_completion_length)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        was_clipped = ((unclipped - clipped).abs() > 0).to(mask.dtype)
        stats = {
            "clip_fraction": float((was_clipped * mask).sum() / n),
            "ratio_mean": float((ratio * mask).sum() / n),
            "kl": float((kl * mask).sum() / n) if kl is not None else 0.0,
        }
        if weights is not None:
            stats["importance_weight_mean"] = float((weights * mask).sum() / n)
    return loss, stats


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor, *, cliprange_value: float
                       ) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss, as TRL's and verl's: the prediction may move at most
    ``cliprange_value`` from its pre-update value ``old_values`` before the loss stops
    rewarding the move, ``0.5 * max((V - R)^2, (clip(V) - R)^2)``, averaged over the tokens in
    ``mask`` (all [B, T]). The clip keeps one batch of noisy returns from dragging the critic,
    and through the shared LoRA the policy, far in one step."""
    mask = mask.to(values.dtype)
    clipped = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    per_token = 0.5 * torch.maximum(unclipped_loss, clipped_loss)
    n = mask.sum().clamp(min=1.0)
    loss = (per_token * mask).sum() / n
    with torch.no_grad():
        stats = {
            "value_loss": float(loss),
            "value_clip_fraction": float(((clipped_loss > unclipped_loss).to(mask.dtype)
                                          * mask).sum() / n),
            "value_mean": float((values * mask).sum() / n),
            "return_mean": float((returns * mask).sum() / n),
        }
    return loss, stats
