"""PPO's pieces against hand-computed tables: GAE over an agent's turns (observations skipped,
a truncated episode, several agents), whitening, the clipped value loss, per-token advantages
in the policy loss. Pure tensor functions: no model."""

import statistics

import pytest
import torch

from agl_bridge.trainer.training.critic import gae_targets
from agl_bridge.trainer.training.gae import chain_gae, chains, gae, masked_whiten
from agl_bridge.trainer.training.losses import clipped_value_loss, grpo_clip_loss


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_gae_skips_observation_tokens_and_ignores_their_rewards():
    """One agent, two turns: [a b] then [obs obs c d] (a tool result merged into turn 1).
    gamma 0.9, lam 0.5, reward 1 at d; the 5 on an observation and the values 9 there count
    for nothing. By hand, over a b c d with V = .1 .2 .3 .4:
    d: 1 - .4 = .6; c: .9*.4 - .3 + .45*.6 = .33; b: .9*.3 - .2 + .45*.33 = .2185;
    a: .9*.2 - .1 + .45*.2185 = .178325."""
    rewards = t([0, 0, 0, 5, 0, 1])
    values = t([.1, .2, 9, 9, .3, .4])
    mask = t([1, 1, 0, 0, 1, 1])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    assert adv[0].tolist() == pytest.approx([.178325, .2185, 0, 0, .33, .6])
    assert ret[0].tolist() == pytest.approx([.278325, .4185, 0, 0, .63, 1.0])


def test_gae_of_a_truncated_episode_bootstraps_from_the_value_after_it():
    """gamma = lam = 1, V = .5 .6, no reward yet: cut off (bootstrap 2) the advantages are
    2 - .6 = 1.4 and .6 - .5 + 1.4 = 1.5 (returns 2, 2); ended, -.6 and -.5 (returns 0, 0).
    Padding after the chain (mask 0) changes nothing."""
    values, rewards, mask = t([.5, .6, 7.0]), t([0, 0, 0]), t([1, 1, 0])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0, bootstrap=t(2.0)[0:1])
    assert adv[0].tolist() == pytest.approx([1.5, 1.4, 0])
    assert ret[0].tolist() == pytest.approx([2.0, 2.0, 0])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([-.5, -.6, 0])
    assert ret[0].tolist() == pytest.approx([0, 0, 0])


def test_lambda_zero_is_the_one_step_td_error_and_rows_are_independent():
    values, rewards, mask = t([1, 2, 3], [0, 0, 0]), t([0, 0, 1], [0, 0, 4]), t([1, 1, 1],
                                                                               [1, 1, 1])
    adv, _ = gae(rewards, values, mask, gamma=0.5, lam=0.0)
    assert adv[0].tolist() == pytest.approx([0.5 * 2 - 1, 0.5 * 3 - 2, 1 - 3])
    assert adv[1].tolist() == pytest.approx([0, 0, 4])


def test_chains_are_an_agents_turns_in_an_episode_in_turn_order():
    keys = [("e1", "a"), ("e1", "b"), ("e1", "a"), ("e2", "a"), ("e1", "a")]
    assert chains(keys, [2, 0, 0, 0, 1]) == [[2, 4, 0], [1], [3]]
    assert chains(keys, [None, 0, 0, 0, 0]) == [[0, 2, 4], [1], [3]]  # no turn: first


def several_agents():
    """Episode e1: agent a's turns 0 and 1 (rows 2, 0: out of order), agent b's turn 0 (row 1);
    episode e2: agent a's turn 0 (row 3). Row 0's first token is an observation."""
    return [
        {"episode_id": "e1", "agent_name": "a", "turn_index": 1, "completion_mask": [0, 1, 1],
         "reward": 1.0},
        {"episode_id": "e1", "agent_name": "b", "turn_index": 0, "completion_mask": [1],
         "reward": 0.5},
        {"episode_id": "e1", "agent_name": "a", "turn_index": 0, "completion_mask": [1, 1],
         "reward": 0.25},
        {"episode_id": "e2", "agent_name": "a", "turn_index": 0, "completion_mask": [1],
         "reward": -1.0},
    ]


def test_chain_gae_carries_rewards_back_over_an_agents_own_turns_only():
    """Values 0, gamma .5, lam 1: an advantage is the discounted reward still to come on its
    own chain. a in e1: turn 1 [obs, .5, 1]; turn 0's last token .25 + .5 * .5 = .5, its first
    .5 * .5 = .25. b gets only its .5, e2's a only its -1."""
    rows = several_agents()
    values = [torch.zeros(len(r["completion_mask"]), dtype=torch.float64) for r in rows]
    masks = [torch.tensor(r["completion_mask"]) for r in rows]
    keys = [(r["episode_id"], r["agent_name"]) for r in rows]
    adv, ret = chain_gae(values, masks, [r["reward"] for r in rows],
                         chains(keys, [r["turn_index"] for r in rows]), gamma=0.5, lam=1.0)
    assert [a.tolist() for a in adv] == [pytest.approx(v) for v in
                                         ([0, .5, 1], [.5], [.25, .5], [-1])]
    assert [r.tolist() for r in ret] == [a.tolist() for a in adv]  # values 0


@pytest.mark.parametrize("adapters", [["p", "p", "p", "p"], ["a", "b", "a", "a"]])
def test_gae_targets_whiten_each_policys_trained_tokens(adapters):
    """The same table, shared (one policy: the 6 trained tokens whitened together) and per
    agent (a's 5 together; b's one token centred: 0). Values 0.1 everywhere."""
    rows = [{**r, "adapter": p} for r, p in zip(several_agents(), adapters)]
    asked = []

    def values_of(name, idx):
        asked.append((name, idx))
        return [torch.full((len(rows[i]["completion_mask"]),), 0.1) for i in idx]

    out = gae_targets(rows, values_of, 2, gamma=0.5, lam=1.0)
    # by hand, delta = r + .5 V' - V (V = .1, 0 after the end), A = delta + .5 A':
    # a in e1, last token first: .9; -.05 + .45 = .4; (turn 0) .2 + .2 = .4; -.05 + .2 = .15
    raw = {0: [0.0, .4, .9], 1: [.4], 2: [.15, .4], 3: [-1.1]}
    assert out[0][0].tolist() == pytest.approx([.1, .1, .1])  # the values before the update
    for i, r in raw.items():  # returns = raw advantages + values, 0 on observations
        assert out[i][2].tolist() == pytest.approx(
            [0.0 if m == 0 else a + .1 for a, m in zip(r, rows[i]["completion_mask"])],
            abs=1e-6)
    for name in set(adapters):
        mine = [(i, j) for i, r in enumerate(rows) if r["adapter"] == name
                for j, m in enumerate(r["completion_mask"]) if m]
        flat = [raw[i][j] for i, j in mine]
        if len(flat) > 1:
            mean, std = statistics.fmean(flat), statistics.stdev(flat)
            want = [(x - mean) / std for x in flat]
        else:
            want = [0.0]
        assert [float(out[i][1][j]) for i, j in mine] == pytest.approx(want, abs=1e-5)
    assert float(out[0][1][0]) == 0.0  # the observation: no advantage
    assert all(len(idx) <= 2 for _, idx in asked)  # asked a batch at a time


def test_masked_whiten_ignores_what_the_mask_leaves_out():
    x, mask = t([1, 2, 3, 100]), t([1, 1, 1, 0])
    assert masked_whiten(x, mask)[0].tolist() == pytest.approx([-1, 0, 1, 0], abs=1e-6)
    assert masked_whiten(t([4, 9]), t([1, 0]))[0].tolist() == [0, 0]


def test_clipped_value_loss_by_hand():
    """old .5, cliprange .2: V 1 (return 2) clips to .7: max((1-2)^2, (.7-2)^2) = 1.69;
    V 0 (return 0) clips to .3: .09; V .6 (return 2) within range: 1.96. Half of each, mean
    over the three trained tokens; the fourth is masked."""
    values = t([1.0, 0.0, 0.6, 100.0]).requires_grad_()
    loss, stats = clipped_value_loss(values, t([.5, .5, .5, .5]), t([2, 0, 2, 0]),
                                     t([1, 1, 1, 0]), cliprange_value=0.2)
    assert float(loss.detach()) == pytest.approx(0.5 * (1.69 + 0.09 + 1.96) / 3)
    assert stats["value_clip_fraction"] == pytest.approx(2 / 3)
    assert stats["return_mean"] == pytest.approx(4 / 3)
    loss.backward()
    # where the clipped term wins, the prediction gets no gradient (it moved far enough)
    assert values.grad[0].tolist() == pytest.approx([0.0, 0.0, (0.6 - 2) / 3, 0.0])


def test_policy_loss_takes_one_advantage_per_token():
    logp = t([-1.0, -2.0]).requires_grad_()
    old = logp.detach().clone()
    mask = t([1, 1])
    per_seq, _ = grpo_clip_loss(logp, old, t(0.5)[0].reshape(1), mask)
    per_tok, _ = grpo_clip_loss(logp, old, t([0.5, 0.5]), mask)
    assert float(per_seq.detach()) == pytest.approx(float(per_tok.detach()))
    assert float(per_tok.detach()) == pytest.approx(-0.5)
    logp.grad = None
    loss, _ = grpo_clip_loss(logp, old, t([1.0, -1.0]), mask)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.5, 0.5])  # each token its own sign


def test_the_conversion_puts_team_and_agent_rewards_on_each_agents_last_turn():
    """Pairs (episode, agent) 0: turns 0, 1; 1: turn 0; 2: two candidates of turn 2 and a
    turn 1; 3: a transition without a turn (counts as last: its rewards must land)."""
    import numpy as np

    from agl_bridge.trainer.rewards.credit import last_turns

    turn = np.array([0, 1, 0, 2, 2, 1, 0])
    valid = np.array([True, True, True, True, True, True, False])
    pair = np.array([0, 0, 1, 2, 2, 2, 3])
    assert last_turns(turn, valid, pair).tolist() == [False, True, True, True, True, False, True]
