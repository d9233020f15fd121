"""Advantages when tasks do not repeat: the batch and key baselines, their fallbacks, and
per-agent normalisation (Dr. MAS), against hand-computed values on small tables."""

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from agl_bridge.trainer.conversion import ConvertConfig, convert, spans_to_transitions
from agl_bridge.trainer.rewards.baselines import loo_advantages, parse_baselines
from tests.factories import llm, reward, table

EPS = 1e-4


def live(rewards, *, agent="a", templates=None, tasks=None):
    """One episode per request, as live traffic has them: every task id different."""
    rows = []
    for i, r in enumerate(rewards):
        call = llm(f"e{i}", i, task=(tasks[i] if tasks else f"req{i}"), agent=agent,
                   prompt=[i])
        if templates and templates[i] is not None:
            call["attributes"] = json.dumps({"app.template": templates[i]})
        rows += [call, reward(f"e{i}", i, r)]
    return rows


def by_episode(out, column="advantage"):
    return {t["episode_id"]: t[column] for t in out.to_pylist()}


def test_group_alone_gives_live_traffic_no_signal():
    out, stats = spans_to_transitions(table(live([1.0, 0.0, 0.5, 0.5])),
                                      ConvertConfig(baseline="group"))
    assert set(by_episode(out).values()) == {0.0}
    assert stats.groups == 4 and stats.baselines == {"group": 4}
    assert "baselines" not in stats.summary().splitlines()[0]


def test_the_default_falls_back_to_the_batch_and_says_so_in_the_summary_line():
    """Issue 29.4: an unchanged program's tasks never repeat; the default baseline (group, then
    batch) still gives its transitions advantages, and the first summary line says which."""
    out, stats = spans_to_transitions(table(live([1.0, 0.0, 0.5, 0.5])))
    assert set(by_episode(out).values()) != {0.0}
    assert stats.baselines == {"batch": 4}
    assert stats.summary().splitlines()[0].endswith("; baselines: batch 4")


def test_under_ppo_the_summary_line_labels_the_groups_as_unused():
    """Issue 34 review: ppo trains on its critic's GAE advantages; the file's groups, their
    reward variance and baselines are said to be the file's, not presented as what trained."""
    cfg = ConvertConfig(algorithm="ppo")
    _, stats = spans_to_transitions(table(live([1.0, 0.0, 0.5, 0.5])), cfg)
    line = stats.summary(cfg.algorithm).splitlines()[0]
    assert line.endswith("-> 4 transitions; ppo: trained on the critic's GAE advantages, not "
                         "the file's group advantages (1 groups (0 with zero reward variance)"
                         "; baselines: batch 4)")
    assert stats.summary().splitlines()[0].endswith(
        "-> 4 transitions in 1 groups (0 with zero reward variance); baselines: batch 4")


def test_batch_normalises_per_agent_and_turn_over_the_output():
    out, stats = spans_to_transitions(table(live([1.0, 0.0, 0.5, 0.5])),
                                      ConvertConfig(baseline="batch"))
    std = math.sqrt((0.25 + 0.25) / 3)
    got = by_episode(out)
    assert got == pytest.approx({"e0": 0.5 / (std + EPS), "e1": -0.5 / (std + EPS),
                                 "e2": 0.0, "e3": 0.0})
    assert set(by_episode(out, "group_id").values()) == {"batch|agent:a|turn:0"}
    assert stats.baselines == {"batch": 4} and stats.groups == 1
    assert "baselines: batch 4" in stats.summary()


def test_key_is_leave_one_out_over_episodes_sharing_the_attribute():
    rows = live([1.0, 0.0, 0.5, 2.0, 0.0, 9.0], templates=["A", "A", "A", "B", "B", None])
    cfg = ConvertConfig(baseline="key:app.template", scale_advantages=False)
    out, stats = spans_to_transitions(table(rows), cfg)
    assert by_episode(out) == pytest.approx({"e0": 1.0 - 0.25, "e1": 0.0 - 0.75,
                                             "e2": 0.5 - 0.5, "e3": 2.0, "e4": -2.0,
                                             "e5": 0.0})  # e5 has no template: no baseline
    assert stats.baselines == {"key:app.template": 5, "none": 1}
    scaled, _ = spans_to_transitions(table(rows), ConvertConfig(baseline="key:app.template"))
    std_a = math.sqrt(((1 - 0.5) ** 2 + 0.5 ** 2 + 0) / 2)
    assert by_episode(scaled)["e0"] == pytest.approx(0.75 / (std_a + EPS))


def test_the_first_baseline_that_applies_wins():
    # req0 repeats (a proper group), the others do not: they fall back to the batch
    rows = live([1.0, 0.0, 0.3, 0.7], tasks=["req0", "req0", "req2", "req3"])
    out, stats = spans_to_transitions(table(rows), ConvertConfig(baseline="group,batch"))
    ids = by_episode(out, "group_id")
    assert ids["e0"] == ids["e1"] == "task:req0|agent:a|turn:0"
    assert ids["e2"] == ids["e3"] == "batch|agent:a|turn:0"
    adv = by_episode(out)
    assert adv["e0"] == pytest.approx(0.5 / (math.sqrt(0.5) + EPS))
    assert adv["e2"] == pytest.approx(-0.2 / (math.sqrt(0.08) + EPS))
    assert stats.baselines == {"group": 2, "batch": 2} and stats.groups == 2


def test_per_agent_normalisation_uses_each_agents_own_statistics():
    # two agents with different reward scales, two turns each, one task repeated twice
    rows = []
    for e, (ra, rb) in enumerate([(1.0, 10.0), (0.0, 30.0)]):
        for turn in (0, 1):
            rows.append(llm(f"e{e}", turn, task="t", agent="a", turn=turn, prompt=[e, turn]))
            rows.append(llm(f"e{e}", turn, task="t", agent="b", turn=turn, prompt=[e, turn, 7]))
        rows += [reward(f"e{e}", 5, ra, scope="agent", agent="a"),
                 reward(f"e{e}", 6, rb, scope="agent", agent="b")]
    out, stats = spans_to_transitions(table(rows), ConvertConfig(per_agent_advantages=True))
    groups = {(t["agent_name"], t["turn_index"]): t["group_id"] for t in out.to_pylist()}
    assert groups[("a", 0)] == groups[("a", 1)] == "task:t|agent:a"  # turns share a group
    std_a, std_b = math.sqrt(4 * 0.25 / 3), math.sqrt(4 * 100 / 3)
    for t in out.to_pylist():
        std = std_a if t["agent_name"] == "a" else std_b
        mean = 0.5 if t["agent_name"] == "a" else 20.0
        assert t["advantage"] == pytest.approx((t["reward"] - mean) / (std + EPS))
    assert stats.groups == 2


def test_with_one_turn_per_agent_per_agent_normalisation_is_at_grpo():
    """Dr. MAS's groups keep the agent and drop the turn; when every agent acts once per
    episode (the relay team) they hold the same transitions as AT-GRPO's (task, agent, turn)
    groups, so the advantages are the same: ``credit_ablation.py``'s ``dr_mas`` arm is a
    replicate of ``at_grpo`` on that task, not another algorithm."""
    rows = []
    for e, (ra, rb) in enumerate([(1.0, 10.0), (0.0, 30.0), (0.5, 0.0)]):
        rows.append(llm(f"e{e}", 0, task="t", agent="a", turn=0, prompt=[e]))
        rows.append(llm(f"e{e}", 1, task="t", agent="b", turn=1, prompt=[e, 7]))
        rows += [reward(f"e{e}", 5, ra, scope="agent", agent="a"),
                 reward(f"e{e}", 6, rb, scope="agent", agent="b")]
    at_grpo, _ = spans_to_transitions(table(rows))
    dr_mas, _ = spans_to_transitions(table(rows), ConvertConfig(per_agent_advantages=True))

    def advantages(out):
        return {(t["episode_id"], t["agent_name"]): t["advantage"] for t in out.to_pylist()}

    assert advantages(dr_mas) == pytest.approx(advantages(at_grpo))
    assert len(set(advantages(at_grpo).values())) > 2  # not all zero: the groups had variance


def test_batch_through_files_equals_in_memory(tmp_path):
    rows = live([float(i % 3) for i in range(40)])
    (tmp_path / "spans").mkdir()
    pq.write_table(table(rows[:30]), tmp_path / "spans" / "a.parquet")
    pq.write_table(table(rows[30:]), tmp_path / "spans" / "b.parquet")
    cfg = ConvertConfig(baseline="batch")
    memory, _ = spans_to_transitions(table(rows), cfg)
    for limit in (100_000, 10):  # streamed, and spilled to buckets
        stats = convert(tmp_path / "spans", tmp_path / "t.parquet", cfg,
                        max_rows_in_memory=limit)
        got = by_episode(pq.read_table(tmp_path / "t.parquet"))
        assert got == pytest.approx(by_episode(memory)) and len(got) == 40
        assert stats.groups == 1 and stats.baselines == {"batch": 40}


def test_loo_by_hand_and_groups_without_signal():
    adv, groups, flat = loo_advantages(np.array([3.0, 1.0, 2.0, 5.0, 5.0, 7.0]),
                                       np.array([0, 0, 0, 1, 1, 2]), scale=False)
    assert adv.tolist() == pytest.approx([1.5, -1.5, 0.0, 0.0, 0.0, 0.0])
    assert (groups, flat) == (3, 2)  # equal rewards, and a group of one


@pytest.mark.parametrize("spec", ["", "group,,batch", "keys:x", "key:", "batch,batch", "nope"])
def test_bad_baselines_are_refused(spec):
    with pytest.raises(ValueError, match="baseline"):
        parse_baselines(spec)
    with pytest.raises(ValueError, match="baseline"):
        ConvertConfig(baseline=spec)


def test_the_cli_takes_the_baseline(tmp_path, capsys):
    from agl_bridge.cli import main

    pq.write_table(table(live([1.0, 0.0])), tmp_path / "spans.parquet")
    assert main(["convert", str(tmp_path / "spans.parquet"), str(tmp_path / "t.parquet"),
                 "--baseline", "group,batch", "--per-agent-advantages"]) == 0
    out = pq.read_table(tmp_path / "t.parquet")
    assert set(out["group_id"].to_pylist()) == {"batch|agent:a"}
    assert sorted(out["advantage"].to_pylist()) == pytest.approx(
        [-0.5 / (math.sqrt(0.5) + EPS), 0.5 / (math.sqrt(0.5) + EPS)])
    assert "baselines: batch 2" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "spans.parquet"), str(tmp_path / "u.parquet"),
                 "--baseline", "sideways"]) == 2
