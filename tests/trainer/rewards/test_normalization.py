"""Batch reward normalisation (the multi-turn PPO design's ``reward_normalization``): each
grouping and method against hand-computed tables, turn scores spread over their chain, and the
errors for values that cannot work."""

import math

import numpy as np
import pytest

from agl_bridge.settings import SettingError, build
from agl_bridge.trainer.rewards.normalization import normalization_groups, normalize_rewards
from agl_bridge.trainer.training.config import GRPOConfig, RewardNormalization, check_algorithm

# four episodes of agent a over turns 0 and 1, the reward on the last turn (use_turn_scores
# off): chain totals 1, 0 (task t1) and 3, 1 (task t2)
EPISODES = ["e0", "e0", "e1", "e1", "e2", "e2", "e3", "e3"]
TASKS = ["t1"] * 4 + ["t2"] * 4
TURNS = [0, 1] * 4
REWARDS = [0.0, 1.0, 0.0, 0.0, 0.0, 3.0, 0.0, 1.0]
STD = math.sqrt(4.75 / 3)  # the sample std of 1, 0, 3, 1 (mean 1.25)


def normalised(grouping, method, rewards=REWARDS, agents=None, tasks=TASKS,
               episodes=EPISODES, turns=TURNS, candidates=None):
    agents = agents or ["a"] * len(rewards)
    candidates = candidates or [None] * len(rewards)
    groups = normalization_groups(grouping, tasks, agents, episodes)
    out, _, _ = normalize_rewards(np.array(rewards), list(zip(episodes, agents, candidates)),
                                  turns, groups, method)
    return out.tolist()


def last_turns(*scores):
    """A table's rewards: 0 on each first turn, ``scores`` on the last ones."""
    return [v for s in scores for v in (0.0, s)]


@pytest.mark.parametrize("grouping, method, want", [
    ("batch", "identity", REWARDS),
    ("state", "identity", REWARDS),
    ("batch", "mean", last_turns(-0.25, -1.25, 1.75, -0.25)),
    ("batch", "mean_std", last_turns(*(d / (STD + 1e-6) for d in (-0.25, -1.25, 1.75, -0.25)))),
    # by state: t1 is 1, 0 (mean .5, std sqrt(.5)); t2 is 3, 1 (mean 2, std sqrt(2))
    ("state", "mean", last_turns(0.5, -0.5, 1.0, -1.0)),
    ("state", "mean_std", last_turns(0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6),
                                     1 / (math.sqrt(2) + 1e-6), -1 / (math.sqrt(2) + 1e-6))),
    # one agent: inductive is the whole batch
    ("inductive", "mean", last_turns(-0.25, -1.25, 1.75, -0.25)),
])
def test_each_grouping_and_method_on_a_table(grouping, method, want):
    assert normalised(grouping, method) == pytest.approx(want, abs=1e-9)


def test_asym_clip_costs_a_failure_at_most_one_std():
    # totals 0, 1, 1, 1: mean .75, std .5, so z = -1.5 (clipped to -1), .5, .5, .5
    rewards = last_turns(0.0, 1.0, 1.0, 1.0)
    want = last_turns(-1.0, *(0.25 / (0.5 + 1e-6),) * 3)
    assert normalised("batch", "asym_clip", rewards) == pytest.approx(want, abs=1e-9)
    assert normalised("batch", "mean_std", rewards)[1] == pytest.approx(-0.75 / (0.5 + 1e-6))


def test_inductive_groups_by_agent_across_tasks():
    # agent a: totals 1, 3 (mean 2); agent b: totals 0, 1 (mean .5)
    agents = ["a", "a", "b", "b", "a", "a", "b", "b"]
    assert normalised("inductive", "mean", agents=agents) == pytest.approx(
        last_turns(-1.0, -0.5, 1.0, 0.5))
    # by state each (task, agent) holds one chain: no spread, so mean_std gives 0
    out, groups, flat = normalize_rewards(
        np.array(REWARDS), list(zip(EPISODES, agents)), TURNS,
        normalization_groups("state", TASKS, agents, EPISODES), "mean_std")
    assert out.tolist() == [0.0] * 8 and (groups, flat) == (4, 4)


def test_a_group_without_spread_gets_zero_and_a_task_less_episode_is_its_own_state():
    equal = last_turns(1.0, 1.0, 3.0, 1.0)  # t1's two chains scored alike
    got = normalised("state", "mean_std", equal)
    assert got[:4] == [0.0] * 4 and got[5] == pytest.approx(1 / (math.sqrt(2) + 1e-6))
    tasks = [None, None, None, None, "t2", "t2", "t2", "t2"]  # e0, e1: groups of one
    assert normalised("state", "mean", tasks=tasks) == pytest.approx(
        last_turns(0.0, 0.0, 1.0, -1.0))


def test_turn_scores_are_scaled_and_the_rest_lands_on_the_last_turn():
    """Chains .5 then 1 (total 1.5) and 0 then .5 (total .5): mean 1, std sqrt(.5). Each
    turn is scaled by 1 / std, the last takes the rest, and each chain still sums to its
    normalised score (+-sqrt(.5); mean: +-.5)."""
    rewards, episodes, turns = [0.5, 1.0, 0.0, 0.5], ["e0", "e0", "e1", "e1"], [0, 1, 0, 1]
    s = 1 / (math.sqrt(0.5) + 1e-6)
    got = normalised("batch", "mean_std", rewards, tasks=["t"] * 4, episodes=episodes,
                     turns=turns)
    assert got == pytest.approx([0.5 * s, 1.0 * s + (0.5 * s - 1.5 * s), 0.0,
                                 0.5 * s + (-0.5 * s - 0.5 * s)])
    assert got[0] + got[1] == pytest.approx(0.5 * s) and got[1] == pytest.approx(0.0, abs=1e-6)
    assert normalised("batch", "mean", rewards, tasks=["t"] * 4, episodes=episodes,
                      turns=turns) == pytest.approx([0.5, 0.0, 0.0, -0.5])


def test_the_last_turn_is_found_out_of_row_order_and_candidates_are_chains_of_their_own():
    # rows out of turn order; a row without a turn comes first in its chain
    rewards, turns = [2.0, 0.0, 0.0], [1, None, 0]
    got = normalised("batch", "mean", rewards, tasks=["t"] * 3, episodes=["e"] * 3,
                     turns=turns)
    assert got == pytest.approx([0.0, 0.0, 0.0])  # one chain: its total minus its own mean
    # two candidates of one turn are two chains (totals 1 and 0)
    got = normalised("batch", "mean", [1.0, 0.0], tasks=["t"] * 2, episodes=["e"] * 2,
                     turns=[0, 0], candidates=[0, 1])
    assert got == pytest.approx([0.5, -0.5])


def test_bad_values_are_refused_with_their_names():
    with pytest.raises(ValueError, match="grouping must be state, batch or inductive, got 'ep"):
        RewardNormalization(grouping="episode")
    with pytest.raises(ValueError, match="method must be identity, mean, mean_std or asym_clip"):
        GRPOConfig(reward_normalization={"method": "zscore"})
    with pytest.raises(SettingError, match=r"loop.toml: reward_normalization.method = 'z': "
                                           "expected one of 'identity'"):
        build(GRPOConfig, {"reward_normalization": {"method": "z"}}, "loop.toml")
    with pytest.raises(SettingError, match=r"unknown setting reward_normalization\.group"):
        build(GRPOConfig, {"reward_normalization": {"group": "state"}}, "loop.toml")
    with pytest.raises(ValueError, match="method must be identity, mean, mean_std or asym"):
        normalize_rewards(np.zeros(2), ["a", "b"], [0, 0], np.zeros(2), "zscore")
    with pytest.raises(ValueError, match="grouping must be state, batch or inductive"):
        normalization_groups("episode", ["t"], ["a"], ["e"])
    # a critic's rewards only: the GRPO family normalises with its baseline
    cfg = GRPOConfig(reward_normalization={"grouping": "state", "method": "mean_std"})
    assert cfg.reward_normalization == RewardNormalization("state", "mean_std")
    check_algorithm(cfg, "ppo")
    for algorithm in ("at_grpo", "lightning_rl", None):
        with pytest.raises(ValueError, match="'mean_std' normalises the rewards a critic "
                                             "learns: it needs algorithm ppo"):
            check_algorithm(cfg, algorithm)
    check_algorithm(GRPOConfig(), "at_grpo")  # identity goes with every algorithm
