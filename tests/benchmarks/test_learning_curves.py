"""``benchmarks/learning_curves.py``: the curves of ``learning_vs_trl.py`` on a hand-made
record (two runs per arm, adapters at known times, known successes)."""

import importlib.util
import math

import pytest

from tests.paths import ROOT


def _curves():
    spec = importlib.util.spec_from_file_location(
        "learning_curves", ROOT / "benchmarks" / "learning_curves.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LC = _curves()
EVALS = {"base": {"k": 30, "n": 100}, "t1": {"k": 40, "n": 100}, "t2": {"k": 50, "n": 100},
         "u1": {"k": 44, "n": 100}, "u2": {"k": 60, "n": 100},
         "o1": {"k": 55, "n": 100}, "o2": {"k": 70, "n": 100}, "p1": {"k": 35, "n": 100}}
TRL = [[{"s": 0, "adapter": "base"}, {"s": 300, "adapter": "t1"}, {"s": 590, "adapter": "t2"}],
       [{"s": 0, "adapter": "base"}, {"s": 310, "adapter": "u1"}, {"s": 595, "adapter": "u2"}]]
OURS = [[{"s": 0, "adapter": "base"}, {"s": 200, "adapter": "o1"}, {"s": 400, "adapter": "o2"}],
        [{"s": 0, "adapter": "base"}, {"s": 250, "adapter": "p1"}]]


def test_a_run_has_at_each_time_the_last_adapter_saved_by_then():
    assert [LC.live_at(TRL[0], t) for t in (0, 299.9, 300, 589, 600)] == \
        ["base", "base", "t1", "t1", "t2"]


def test_runs_pool_successes_and_keep_their_spread():
    at_300 = LC.curve(TRL, EVALS, [300])[0]  # t1 (40) and base (30): the second run saves later
    assert (at_300["k"], at_300["n"], at_300["rate"]) == (70, 200, 0.35)
    assert (at_300["run_min"], at_300["run_max"]) == (0.30, 0.40)
    assert at_300["low"] < 0.35 < at_300["high"]


def test_first_reach_of_the_reference_final_and_the_verdict():
    result = LC.summary({"trl": TRL, "ours": OURS}, EVALS, 600, 4)
    assert result["target"] == 0.55  # TRL's last adapters: 50 + 60 of 200
    assert [p["s"] for p in result["curves"]["ours"]] == [0, 150, 300, 450, 600]
    assert result["reach"]["trl"] == {"per_run": [None, 595], "median": None}
    # ours: run 1 at 200 s (o1: 55%), run 2 never: the median of (200, never) is never
    assert result["reach"]["ours"] == {"per_run": [200, None], "median": None}
    assert any(line.endswith("not met") for line in LC.reach_lines(result))


def test_the_target_is_met_when_the_median_run_gets_there_in_half_the_budget():
    result = LC.summary({"trl": TRL, "ours": OURS[:1] * 3}, EVALS, 600, 4)
    assert result["reach"]["ours"]["median"] == 200
    assert any(line.endswith(": met") for line in LC.reach_lines(result))
    assert "35.0% [" in LC.table(result)  # TRL at 300 s: (40 + 30) / 200


def test_no_verdict_when_the_reference_ends_where_it_started():
    flat = [[{"s": 0, "adapter": "base"}, {"s": 500, "adapter": "p1"}]]  # 30% -> 35%
    result = LC.summary({"trl": [[{"s": 0, "adapter": "base"}]], "ours": flat}, EVALS, 600, 2)
    assert result["target"] == result["start"]["rate"] == 0.30
    assert LC.reach_lines(result)[-1].startswith("target undecided")


def test_an_unevaluated_adapter_is_an_error_not_a_zero():
    with pytest.raises(KeyError):
        LC.first_reach([{"s": 0, "adapter": "missing"}], EVALS, 0.5)
    assert math.isclose(LC.rate(EVALS, "o2"), 0.7)
