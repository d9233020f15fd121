import math

import pytest
import torch

from agl_bridge.trainer.losses import group_advantages, grpo_clip_loss, token_logprobs


def test_group_advantages_by_hand():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5, 3.0], ["a", "a", "b", "b", "c"], eps=0.0)
    # group a: mean 0.5, sample std sqrt(0.5); group b: no variance; group c: alone
    assert adv[0] == pytest.approx(0.5 / math.sqrt(0.5))
    assert adv[1] == pytest.approx(-0.5 / math.sqrt(0.5))
    assert adv[2:] == [0.0, 0.0, 0.0]


def test_different_groups_never_mix():
    adv = group_advantages([1.0, 0.0, 100.0, 0.0], ["t1", "t1", "t2", "t2"], eps=0.0)
    assert adv[0] == pytest.approx(-adv[1]) and adv[0] == pytest.approx(adv[2])


def test_group_advantages_length_mismatch():
    with pytest.raises(ValueError, match="2 rewards but 1 group"):
        group_advantages([1.0, 2.0], ["a"])


def test_token_logprobs_match_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 11)
    targets = torch.randint(0, 11, (2, 3))
    expected = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(token_logprobs(logits, targets), expected, atol=1e-6)


def test_clip_loss_by_hand():
    logp = torch.tensor([[math.log(1.5), math.log(0.5)], [math.log(1.1), 0.0]])
    old = torch.zeros(2, 2)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = grpo_clip_loss(logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.3)
    # seq 0, A=+1: ratio 1.5 -> min(1.5, 1.3) = 1.3; ratio 0.5 -> min(0.5, 0.8) = 0.5
    # seq 1, A=-2: ratio 1.1 -> min(-2.2, -2.2) = -2.2; last token masked out
    expected = -(1.3 + 0.5 - 2.2) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats["clip_fraction"] == pytest.approx(2 / 3)


def test_on_policy_gradient_is_advantage_weighted_score():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, stats = grpo_clip_loss(logp, logp.detach(), torch.tensor([0.5]), torch.ones(1, 2))
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.25, -0.25]]))
    assert stats == {"clip_fraction": 0.0, "ratio_mean": 1.0}
