"""The demo team's pure parts: its reward parts and how it reads a task (given, or replayed from
the question the service recorded)."""

import pytest

from agl_bridge.trainer.loop.teams.arith import operands, score


@pytest.mark.parametrize("task, expected", [
    ({"task_id": "t", "a": 3, "b": "4"}, (3, 4)),
    ({"task_id": "replay:req-1-57+8", "demo.question": "57 + 8"}, (57, 8)),
    ({"task_id": "r", "demo.question": " 5+6 ", "source_episode": "e"}, (5, 6)),
])
def test_operands(task, expected):
    assert operands(task) == expected


@pytest.mark.parametrize("task", [{"task_id": "x"}, {"task_id": "y", "demo.question": "5 - 6"},
                                  {"task_id": "z", "a": 1}])
def test_a_task_without_its_numbers_is_named(task):
    with pytest.raises(ValueError, match=f"task '{task['task_id']}': neither a and b"):
        operands(task)


@pytest.mark.parametrize("text, parts", [
    ("3 + 4 = 7", {"correct": 1.0, "close": 0.0, "form": 0.2}),
    ("it is 7.", {"correct": 1.0, "close": 0.0, "form": 0.0}),
    ("3 + 4 = 9", {"correct": 0.0, "close": 0.3 * 0.8, "form": 0.2}),
    ("no idea", {"correct": 0.0, "close": 0.0, "form": 0.0}),
])
def test_score_parts(text, parts):
    assert score(text, 3, 4) == pytest.approx(parts)
