"""``benchmarks/credit_ablation.py``: each task's arms as the demo's flags (parsed by the demo's
own parser), where each task's runs and records go, and the report of hand-made records of the
retry task (team success, the solver's own, the team's measures pooled over seeds); the relay
table still made from the committed records, as the README has it."""

import argparse
import importlib.util
import sys

import pytest

from agl_bridge.settings import file_layer
from agl_bridge.trainer.loop.demo import team_agents
from agl_bridge.trainer.loop.demo_config import add_demo_flags, demo_settings
from agl_bridge.trainer.loop.report import mean_ci, wilson
from agl_bridge.trainer.loop.teams import retry
from tests.paths import ROOT


def _ablation():
    spec = importlib.util.spec_from_file_location(
        "credit_ablation", ROOT / "benchmarks" / "credit_ablation.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


CA = _ablation()


def _args(tmp_path, **kw):
    values = dict(rounds=4, minutes=20.0, eval_tasks=200, quick=False, workdir=str(tmp_path),
                  results=str(tmp_path / "results"), results_given=False, report=False)
    return argparse.Namespace(**{**values, **kw})


def _demo(flags):
    """The demo's settings from an arm's command line, through the demo's own parser."""
    parser = argparse.ArgumentParser()
    add_demo_flags(parser)
    args = parser.parse_args(flags[1:])  # without the subcommand
    label, values = file_layer(args)
    demo, loop, _ = demo_settings(args, values, label)
    return demo, loop


def test_each_task_has_its_arms_and_the_demos_roles():
    assert list(CA.TASKS["retry"].arms) == ["at_grpo", "lightning_rl", "ppo"]
    assert {"at_grpo", "lightning_rl", "ppo", "tree", "sft"} <= set(CA.TASKS["relay"].arms)
    for task in CA.TASKS.values():
        assert task.roles == team_agents(task.name)
        assert task.reference in task.arms


@pytest.mark.parametrize("task, arm, algorithm", [
    ("relay", "at_grpo", "at_grpo"), ("relay", "ppo", "ppo"), ("relay", "lightning_rl",
                                                               "lightning_rl"),
    ("retry", "at_grpo", "at_grpo"), ("retry", "lightning_rl", "lightning_rl"),
    ("retry", "ppo", "ppo")])
def test_an_arm_is_the_demo_on_its_task_with_its_switch(tmp_path, task, arm, algorithm):
    t = CA.TASKS[task]
    flags = CA.arm_flags(t, arm, 1, _args(tmp_path), tmp_path / "w")
    demo, loop = _demo(flags)
    assert flags[0] == "demo"
    assert (demo.task, demo.seed, demo.eval_size) == (task, 1, 200)
    assert (loop.rounds, loop.convert.algorithm, loop.train.objective) == (4, algorithm, "grpo")
    assert loop.minutes == 24 * 60  # the budget is the rounds
    assert (loop.train.lam, loop.train.vf_coef) == (0.95, 0.1)  # ppo: the demo's critic


def test_a_quick_arm_is_one_round_of_the_tiny_model(tmp_path):
    flags = CA.arm_flags(CA.TASKS["retry"], "ppo", 0, _args(tmp_path, quick=True, eval_tasks=20),
                         tmp_path / "w")
    demo, loop = _demo(flags)
    assert (demo.task, loop.model, loop.rounds, loop.tasks_per_round) == ("retry", "tiny", 1, 4)
    assert loop.convert.algorithm == "ppo"


def test_the_tasks_runs_and_records_cannot_collide(tmp_path):
    args = _args(tmp_path)
    relay, retry_task = CA.TASKS["relay"], CA.TASKS["retry"]
    assert CA.kept_record(relay, "ppo", 0, args) == tmp_path / "results" / "ppo-seed0.json"
    assert CA.kept_record(retry_task, "ppo", 0, args) == \
        tmp_path / "results" / "retry" / "ppo-seed0.json"
    # quick runs keep records only where --results was given
    assert CA.kept_record(retry_task, "ppo", 0, _args(tmp_path, quick=True)) is None
    assert CA.kept_record(retry_task, "ppo", 0, _args(tmp_path, quick=True,
                                                      results_given=True)) is not None
    assert CA.kept_record(relay, "ppo", 0, _args(tmp_path, results="")) is None


def test_a_record_of_another_task_or_model_is_refused(tmp_path):
    old = tmp_path / "at_grpo-seed0.json"  # a relay record of before: no task, no model
    old.write_text('{"arm": "at_grpo", "seed": 0}')
    assert CA.read_record(old, CA.TASKS["relay"], _args(tmp_path))["arm"] == "at_grpo"
    with pytest.raises(SystemExit, match="task relay"):
        CA.read_record(old, CA.TASKS["retry"], _args(tmp_path))
    with pytest.raises(SystemExit, match="on smollm2"):
        CA.read_record(old, CA.TASKS["relay"], _args(tmp_path, quick=True))


def _episodes(right: int, first: int, turns: list[int]) -> list[dict]:
    """Result lines of the retry team: ``right`` successes, ``first`` of them at once."""
    return [{"success": i < right, "first_try": i < first, "turns": t}
            for i, t in enumerate(turns)]


def _evaluation(rows: list[dict]) -> dict:
    """A held-out evaluation as the demo records it for the retry team."""
    k = sum(r["success"] for r in rows)
    return {"success": wilson(k, len(rows)), "agents": {"solver": wilson(k, len(rows))},
            "measures": retry.measures(rows)}


BEFORE = [_episodes(2, 1, [1, 2, 3, 3, 3, 3, 3, 3, 3, 3]),
          _episodes(1, 1, [1, 3, 3, 3, 3, 3, 3, 3, 3, 3])]
AFTER = {"at_grpo": [_episodes(4, 2, [1, 1, 2, 2, 3, 3, 3, 3, 3, 3]),
                     _episodes(3, 3, [1, 1, 1, 3, 3, 3, 3, 3, 3, 3])],
         "ppo": [_episodes(8, 6, [1, 1, 1, 1, 1, 1, 2, 2, 3, 3]),
                 _episodes(6, 5, [1, 1, 1, 1, 1, 3, 3, 3, 3, 3])]}


def _records() -> dict[str, list[dict]]:
    return {arm: [{"task": "retry", "arm": arm, "seed": s, "rounds": 4,
                   "baseline": _evaluation(BEFORE[s]), "final": _evaluation(runs[s])}
                  for s in (0, 1)] for arm, runs in AFTER.items()}


def test_the_retry_measures_are_the_demos():
    assert CA.TASKS["retry"].measures == tuple(retry.measures(BEFORE[0]))


def test_pooled_means_are_those_of_all_the_values():
    pooled = CA.pool([retry.measures(rows)["replies per task"] for rows in AFTER["ppo"]])
    whole = mean_ci([float(r["turns"]) for rows in AFTER["ppo"] for r in rows])
    assert pooled == pytest.approx(whole)
    assert CA.pool([wilson(3, 10), wilson(5, 10)]) == {"k": 8, "n": 20}


def test_the_retry_report_pools_seeds_and_compares_with_at_grpo():
    task = CA.TASKS["retry"]
    summary = CA.summarize(_records(), task)
    ppo = summary["ppo"]
    assert ppo["pooled"] == {"team": [3, 20, 14, 20], "solver": [3, 20, 14, 20]}
    assert ppo["measures"]["right at the first reply"] == {"before": {"k": 2, "n": 20},
                                                           "after": {"k": 11, "n": 20}}
    assert ppo["measures"]["replies per task"]["after"]["mean"] == pytest.approx(36 / 20)
    assert summary["at_grpo"]["measures"]["replies per task"]["before"]["mean"] == \
        pytest.approx(55 / 20)
    diff = ppo["team_after_minus_reference"]  # 14/20 against 7/20
    assert diff[0] == pytest.approx(0.35) and diff[1] < 0.35 < diff[2]
    assert "team_after_minus_reference" not in summary["at_grpo"]
    table = CA.markdown_table(summary, task).splitlines()
    assert table[0] == ("| arm | seeds | team before -> after (pooled) | solver's own | right at "
                        "the first reply, 95% | replies per task, 95% | after - `at_grpo`, "
                        "points |")
    assert table[1].count("|") == table[0].count("|")
    assert table[2].startswith("| `at_grpo` | 2 | 15.0% [5.2, 36.0] -> **35.0% [18.1, 56.7]** "
                               "| 15.0% -> 35.0% | 10.0% [2.8, 30.1] -> 25.0% [11.2, 46.9] "
                               "| 2.75 [")
    assert table[3].startswith("| `ppo` | 2 | 15.0% [5.2, 36.0] -> 70.0% [48.1, 85.5] | ")
    assert table[3].endswith(" | +35.0 [+6.0, +64.0] |")


def test_the_retry_console_table_and_plot(tmp_path, capsys):
    task, records = CA.TASKS["retry"], _records()
    CA.print_table(CA.summarize(records, task), task)
    out = capsys.readouterr().out.splitlines()
    assert "right at the first reply before -> after" in out[0] and "after - at_grpo" in out[0]
    assert out[3].startswith("ppo") and "+35.0 [+6.0, +64.0]" in out[3]
    CA.plot(records, task, str(tmp_path / "retry.png"))
    assert (tmp_path / "retry.png").stat().st_size > 0


def test_the_relay_table_is_still_the_readmes():
    """The committed relay records (no task, no model in them) make the README's table."""
    task = CA.TASKS["relay"]
    args = _args(ROOT, results=str(ROOT / "benchmarks" / "results" / "ablation"))
    arms = [a for a in task.arms if a != "ppo"]  # not measured yet
    records = {a: [CA.read_record(CA.kept_record(task, a, s, args), task, args) for s in (0, 1)]
               for a in arms}
    table = CA.markdown_table(CA.summarize(records, task), task)
    readme = (ROOT / "benchmarks" / "README_ablation.md").read_text()
    assert table.splitlines()[0] == ("| arm | seeds | team before -> after (pooled) | reader's "
                                     "own | solver's own | after - `at_grpo`, points |")
    assert table in readme
