"""The multi-turn PPO design's data knobs on tables: ``rollout_filter_ratio`` (keep the groups
whose rewards spread most) and ``use_turn_scores`` (a turn's reward for its turn, or for the
agent's whole episode), under ``ppo`` and ``at_grpo``."""

import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from agl_bridge.trainer.conversion import ConvertConfig, convert
from agl_bridge.trainer.rewards.selection import keep_by_spread
from tests.factories import llm, reward, table

# g1 spreads .5; g3 sqrt(1/6) = .41; g2 (equal rewards) and g4 (one member) 0
REWARDS = [1.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.5, 3.0]
GROUPS = ["g1", "g1", "g2", "g2", "g3", "g3", "g3", "g4"]


@pytest.mark.parametrize("ratio, kept", [
    (1.0, ["g1", "g2", "g3", "g4"]),
    (0.5, ["g1", "g3"]),
    (0.25, ["g1"]),
    (0.6, ["g1", "g2", "g3"]),  # 2.4 groups, rounded up; of the tied g2 and g4, g2 came first
    (0.01, ["g1"]),  # never none
])
def test_rollout_filter_keeps_the_groups_whose_rewards_spread_most(ratio, kept):
    keep = keep_by_spread(np.array(REWARDS), np.array(GROUPS), ratio)
    assert sorted({g for g, k in zip(GROUPS, keep) if k}) == kept
    assert all(k == (g in kept) for g, k in zip(GROUPS, keep))  # whole groups only


def test_rollout_filter_ratio_outside_its_range_is_refused():
    from agl_bridge.trainer.training.config import GRPOConfig

    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="rollout_filter_ratio must be in"):
            keep_by_spread(np.array(REWARDS), np.array(GROUPS), bad)
        with pytest.raises(ValueError, match="rollout_filter_ratio must be in"):
            GRPOConfig(rollout_filter_ratio=bad)


def placed(tmp_path, **options):
    """One solver over turns 0, 1, 2 and a checker's turn 0 per episode; the team reward 1,
    turn rewards .25 (turn 0) and .5 (turn 1) for the solver, .125 for the checker's turn."""
    rows = []
    for turn in (0, 1, 2):
        rows.append(llm("e0", 10 * turn, agent="solver", turn=turn, prompt=[257, 40 + turn],
                        completion=[60 + turn, 258]))
    rows += [llm("e0", 5, agent="checker", turn=0, prompt=[257, 50], completion=[61, 258]),
             reward("e0", 40, 1.0),
             reward("e0", 41, 0.25, scope="turn", agent="solver", turn=0),
             reward("e0", 42, 0.5, scope="turn", agent="solver", turn=1),
             reward("e0", 43, 0.125, scope="turn", agent="checker", turn=0)]
    spans = tmp_path / "spans"
    spans.mkdir(exist_ok=True)
    pq.write_table(table(rows), spans / "part.parquet")
    out = tmp_path / f"t-{len(list(tmp_path.iterdir()))}.parquet"
    convert(spans, out, ConvertConfig(**options))
    return {(t["agent_name"], t["turn_index"]): t["reward"]
            for t in pq.read_table(out).to_pylist()}


@pytest.mark.parametrize("algorithm, use_turn_scores, want", [
    # ppo: each reward at the end of its turn; off, the agent's turn rewards on its last turn
    ("ppo", True, {("solver", 0): .25, ("solver", 1): .5, ("solver", 2): 1.0,
                   ("checker", 0): 1.125}),
    ("ppo", False, {("solver", 0): 0.0, ("solver", 1): 0.0, ("solver", 2): 1.75,
                    ("checker", 0): 1.125}),
    # at_grpo: team + the turn's own; off, team + all the agent's turn rewards on every turn
    ("at_grpo", True, {("solver", 0): 1.25, ("solver", 1): 1.5, ("solver", 2): 1.0,
                       ("checker", 0): 1.125}),
    ("at_grpo", False, {("solver", 0): 1.75, ("solver", 1): 1.75, ("solver", 2): 1.75,
                        ("checker", 0): 1.125}),
])
def test_use_turn_scores_places_turn_rewards_on_their_turn_or_the_agents_episode(
        tmp_path, algorithm, use_turn_scores, want):
    got = placed(tmp_path, algorithm=algorithm, use_turn_scores=use_turn_scores)
    assert got == pytest.approx(want)
    if algorithm == "ppo":  # nothing counted twice: an agent's turns sum to AT-GRPO's total
        assert math.fsum(v for (a, _), v in got.items() if a == "solver") == pytest.approx(1.75)


def test_training_keeps_only_the_filtered_groups(tiny, tmp_path):
    import json

    from agl_bridge.trainer.adapters import METADATA_FILE
    from agl_bridge.trainer.training import GRPOConfig, train_policy
    from tests.factories import transitions

    data = transitions([1.0, 0.0, 0.6, 0.4, 0.5, 0.5], groups=["g1", "g1", "g2", "g2", "g3",
                                                               "g3"])
    cfg = GRPOConfig(rollout_filter_ratio=0.3, filter_zero_variance_groups=False,
                     per_device_train_batch_size=1)
    result = train_policy(data, tiny, tmp_path, config=cfg, progress=False)
    meta = json.loads((result.adapter_dir / METADATA_FILE).read_text())
    assert meta["transitions"] == 2 and result.steps == 2  # g1 of 3 groups (0.9, up: 1)
    assert sorted(m["reward_mean"] for m in result.metrics) == [0.0, 1.0]
