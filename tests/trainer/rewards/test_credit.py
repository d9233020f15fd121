"""Credit assignment (``trainer/rewards/credit.py``) on tables: AT-GRPO mixes the team reward
with an agent's own, LightningRL gives every transition the team's; ``gamma`` discounts the
team reward back from an agent's last turn."""

import numpy as np
import pytest

from agl_bridge.trainer.rewards.credit import discounted, transition_rewards

TEAM = np.array([1.0, 1.0, 0.0])
LOCAL = np.array([0.5, -0.5, 0.25])


@pytest.mark.parametrize("algorithm, alpha, want", [
    ("at_grpo", 1.0, [1.5, 0.5, 0.25]),
    ("at_grpo", 0.5, [1.0, 0.0, 0.25]),
    ("at_grpo", 0.0, [0.5, -0.5, 0.25]),  # only the agent's own
    ("lightning_rl", 1.0, [1.0, 1.0, 0.0]),  # the team's, whatever the agent did
    ("lightning_rl", 0.0, [1.0, 1.0, 0.0]),  # alpha is AT-GRPO's
])
def test_transition_rewards(algorithm, alpha, want):
    got = transition_rewards(TEAM, LOCAL, algorithm=algorithm, alpha=alpha)
    np.testing.assert_allclose(got, want)


def test_the_team_reward_is_discounted_back_from_each_agents_last_turn():
    # episode-agent 0 acts at turns 0, 1, 2; episode-agent 1 at turns 0 and 3; the last
    # transition has no turn and keeps the whole team reward
    team = np.ones(6)
    turn = np.array([0, 1, 2, 0, 3, 0])
    valid = np.array([True, True, True, True, True, False])
    pair = np.array([0, 0, 0, 1, 1, 1])
    got = discounted(team, turn, valid, pair, gamma=0.5)
    np.testing.assert_allclose(got, [0.25, 0.5, 1.0, 0.125, 1.0, 1.0])
    assert discounted(team, turn, valid, pair, gamma=1.0) is team  # no discount: as given
    assert len(discounted(np.zeros(0), turn[:0], valid[:0], pair[:0], gamma=0.5)) == 0
