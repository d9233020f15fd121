import math

import pytest
import torch

from agl_bridge.trainer.training.losses import (
    aggregate,
    grpo_clip_loss,
    importance_weights,
    kl_k3,
    linear_token_logprobs,
    token_logprobs,
)


def test_token_logprobs_match_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11)
    targets = torch.randint(0, 11, (2, 3))
    expected = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets), expected, atol=1e-6)


@pytest.mark.parametrize("tile_bytes", [4 * 50, 4 * 50 * 3, 1 << 20])  # 1 row, 3 rows, all
def test_linear_token_logprobs_match_the_full_logits_path_with_gradients(tile_bytes):
    torch.manual_seed(0)
    hidden = torch.randn(10, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(50, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (10,))
    logits = hidden @ weight.T + bias  # float64 all through (token_logprobs computes in float32)
    expected = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    got = linear_token_logprobs(hidden, weight, targets, bias, tile_bytes=tile_bytes)
    assert torch.allclose(got, expected)
    upstream = torch.randn(10, dtype=torch.float64)
    want = torch.autograd.grad((expected * upstream).sum(), (hidden, weight, bias))
    have = torch.autograd.grad((got * upstream).sum(), (hidden, weight, bias))
    assert all(torch.allclose(a, b) for a, b in zip(want, have))
    assert torch.autograd.gradcheck(
        lambda h, w, b: linear_token_logprobs(h, w, targets, b, tile_bytes=tile_bytes),
        (hidden, weight, bias))


def test_linear_token_logprobs_float32_without_bias_and_frozen_weight():
    torch.manual_seed(1)
    hidden = torch.randn(7, 16, requires_grad=True)
    weight = torch.randn(300, 16)  # a frozen (tied) head: no weight gradient is computed
    targets = torch.randint(0, 300, (7,))
    got = linear_token_logprobs(hidden, weight, targets, tile_bytes=4 * 300 * 2)
    strided = torch.randn(16, 7).t().requires_grad_()  # a non-contiguous input works too
    linear_token_logprobs(strided, weight, targets, tile_bytes=4 * 300 * 2).sum().backward()
    assert strided.grad.shape == (7, 16)
    expected = token_logprobs(hidden @ weight.T, targets)
    assert got.dtype == torch.float32 and torch.allclose(got, expected, atol=1e-5)
    (g_have,) = torch.autograd.grad(got.sum(), hidden)
    (g_want,) = torch.autograd.grad(expected.sum(), hidden)
    assert torch.allclose(g_have, g_want, atol=1e-5)


def test_clip_loss_by_hand():
    logp = torch.tensor([[math.log(1.5), math.log(0.5)], [math.log(1.1), 0.0]])
    old = torch.zeros(2, 2)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = grpo_clip_loss(logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.3)
    # seq 0, A=+1: ratio 1.5 -> min(1.5, 1.3) = 1.3; ratio 0.5 -> min(0.5, 0.8) = 0.5
    # seq 1, A=-2: ratio 1.1 -> min(-2.2, -2.2) = -2.2; last token masked out
    assert loss.item() == pytest.approx(-(1.3 + 0.5 - 2.2) / 3, rel=1e-6)  # token mean
    assert stats["clip_fraction"] == pytest.approx(2 / 3)


def test_aggregations_by_hand():
    per_token = torch.tensor([[1.0, 3.0, 0.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "grpo").item() == pytest.approx((2.0 + 4.0) / 2)
    assert aggregate(per_token, mask, "bnpo").item() == pytest.approx(8.0 / 3)
    assert aggregate(per_token, mask, "dapo").item() == pytest.approx(8.0 / 3)
    assert aggregate(per_token, mask, "dr_grpo", max_completion_length=4).item() == \
        pytest.approx(8.0 / (2 * 4))
    with pytest.raises(ValueError, match="loss_type"):
        aggregate(per_token, mask, "mean")


def test_kl_k3_is_zero_at_the_reference_and_positive_elsewhere():
    logp = torch.tensor([-1.0, -2.0])
    assert torch.equal(kl_k3(logp, logp), torch.zeros(2))
    ref = torch.tensor([-1.5, -1.0])
    d = ref - logp
    assert torch.allclose(kl_k3(logp, ref), torch.exp(d) - d - 1)
    assert (kl_k3(logp, ref) > 0).all()


def test_kl_penalty_adds_beta_times_k3():
    logp = torch.tensor([[-1.0]], requires_grad=True)
    ref = torch.tensor([[-2.0]])
    base, _ = grpo_clip_loss(logp, logp.detach(), torch.tensor([0.0]), torch.ones(1, 1))
    with_kl, stats = grpo_clip_loss(logp, logp.detach(), torch.tensor([0.0]), torch.ones(1, 1),
                                    beta=0.1, ref_logprobs=ref)
    k3 = math.exp(-1.0) + 1.0 - 1.0
    assert with_kl.item() - base.item() == pytest.approx(0.1 * k3)
    assert stats["kl"] == pytest.approx(k3)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_clip_loss(logp, logp.detach(), torch.tensor([0.0]), torch.ones(1, 1), beta=0.1)


def test_importance_weights_are_truncated_ratios_without_gradient():
    old = torch.tensor([-1.0, -1.0, -1.0], requires_grad=True)
    behaviour = torch.tensor([-1.0, -2.0, -0.5])
    w = importance_weights(old, behaviour, cap=2.0)
    assert torch.allclose(w, torch.tensor([1.0, 2.0, math.exp(-0.5)]))  # e^1 capped at 2
    assert not w.requires_grad


def test_on_policy_gradient_is_advantage_weighted_score():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, stats = grpo_clip_loss(logp, logp.detach(), torch.tensor([0.5]), torch.ones(1, 2))
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.25, -0.25]]))
    assert stats == {"clip_fraction": 0.0, "ratio_mean": 1.0, "kl": 0.0}
