"""The loop's state file (``trainer/loop/state.py``): resumable, refused when the settings
changed (named by their dotted path), damaged files named, written atomically."""

import json

import pytest

from agl_bridge.trainer.loop.state import LoopState

SETTINGS = {"model": "m", "rounds": 2, "minutes": 10.0,
            "train": {"lora_r": 8, "learning_rate": 1e-4},
            "convert": {"evaluation_weights": {"thumbs": 1.0}}}


def test_a_resumed_state_keeps_its_rounds_and_takes_a_new_budget(tmp_path):
    state = LoopState(tmp_path, SETTINGS, fresh=False)
    state.data["rounds"].append({"round": 0})
    with state.timed("train"):
        pass
    again = LoopState(tmp_path, {**SETTINGS, "rounds": 5, "minutes": 30.0}, fresh=False)
    assert again.data["rounds"] == [{"round": 0}] and again.data["resumed"] == 1
    assert again.data["settings"]["rounds"] == 5 and again.data["settings"]["minutes"] == 30.0
    assert "train" in again.data["seconds"] and again.elapsed >= 0.0
    fresh = LoopState(tmp_path, SETTINGS, fresh=True)
    assert fresh.data["rounds"] == [] and fresh.data["resumed"] == 0


@pytest.mark.parametrize("change, named", [
    ({"train": {"lora_r": 16, "learning_rate": 1e-4}}, "train.lora_r"),
    ({"convert": {"evaluation_weights": {"thumbs": 2.0}}}, "convert.evaluation_weights.thumbs"),
    ({"model": "other"}, "model"),
])
def test_other_settings_are_refused_by_their_dotted_path(tmp_path, change, named):
    LoopState(tmp_path, SETTINGS, fresh=False)
    with pytest.raises(SystemExit, match=rf"other settings \({named}\); use --fresh"):
        LoopState(tmp_path, {**SETTINGS, **change}, fresh=False)


def test_a_damaged_state_file_is_named_and_left_alone(tmp_path):
    (tmp_path / "state.json").write_text('{"settings": {"model"')
    with pytest.raises(SystemExit, match=r"state\.json is damaged"):
        LoopState(tmp_path, SETTINGS, fresh=False)
    assert (tmp_path / "state.json").read_text() == '{"settings": {"model"'


def test_saves_leave_no_temporary_file(tmp_path):
    state = LoopState(tmp_path, SETTINGS, fresh=False)
    for i in range(3):
        state.data["rounds"].append({"round": i})
        state.save()
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    assert len(json.loads((tmp_path / "state.json").read_text())["rounds"]) == 3
