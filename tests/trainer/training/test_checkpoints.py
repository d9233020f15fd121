"""Resuming never runs code from a checkpoint: tensors come from safetensors, the rest from JSON,
and a pickled checkpoint is refused before anything in it is read."""

import json
import pickle

import pytest
from safetensors.torch import load_file, save_file

from agl_bridge.trainer.training import GRPOConfig, train_policy
from agl_bridge.trainer.training.checkpoints import STATE_FILE, TENSORS_FILE
from tests.factories import transitions


class _Payload:
    """Unpickling this writes a marker file: what a crafted checkpoint would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def checkpoint(tiny, tmp_path):
    data = transitions([1.0, 0.0, 0.7, 0.1])
    cfg = GRPOConfig(learning_rate=1e-2, per_device_train_batch_size=2, save_steps=1, max_steps=1)
    train_policy(data, tiny, tmp_path / "a", checkpoint_dir=tmp_path / "ckpt", config=cfg,
                 progress=False)
    return data, tmp_path / "ckpt" / "checkpoint-1"


def resume(tiny, tmp_path, data, path):
    return train_policy(data, tiny, tmp_path / "r", checkpoint_dir=path.parent,
                        resume_from_checkpoint=path, progress=False,
                        config=GRPOConfig(learning_rate=1e-2, per_device_train_batch_size=2))


def test_a_checkpoint_holds_no_pickle(checkpoint):
    _, path = checkpoint
    assert sorted(p.name for p in path.iterdir()) == [STATE_FILE, TENSORS_FILE]
    state = json.loads((path / STATE_FILE).read_text())
    assert state["step"] == 1 and state["next_micro_batch"] == 1
    assert any(k.startswith("lora/") for k in load_file(str(path / TENSORS_FILE)))


def test_a_pickled_checkpoint_is_refused_without_running_it(tiny, tmp_path):
    marker = tmp_path / "pwned"
    crafted = tmp_path / "ckpt" / "checkpoint-5"
    crafted.mkdir(parents=True)
    (crafted / "state.pt").write_bytes(pickle.dumps({"x": _Payload(str(marker))}))
    with pytest.raises(ValueError, match=r"pickled checkpoint .* not loaded"):
        resume(tiny, tmp_path, transitions([1.0, 0.0]), crafted)
    assert not marker.exists()


def test_tampered_checkpoints_are_refused_with_the_reason(tiny, tmp_path, checkpoint):
    data, path = checkpoint
    state = json.loads((path / STATE_FILE).read_text())
    (path / STATE_FILE).write_text(json.dumps({**state, "format": "other"}))
    with pytest.raises(ValueError, match="not an agl-bridge checkpoint"):
        resume(tiny, tmp_path, data, path)
    (path / STATE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="unreadable checkpoint"):
        resume(tiny, tmp_path, data, path)
    (path / STATE_FILE).write_text(json.dumps(state))
    tensors = load_file(str(path / TENSORS_FILE))
    name = next(k for k in tensors if k.startswith("lora/"))
    tensors[name] = tensors[name][:1].contiguous()
    save_file(tensors, str(path / TENSORS_FILE))
    with pytest.raises(ValueError, match="has shape"):
        resume(tiny, tmp_path, data, path)
    (path / TENSORS_FILE).write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match="unreadable checkpoint"):
        resume(tiny, tmp_path, data, path)


def test_a_save_killed_before_its_rename_is_never_resumed_and_is_removed(tiny, tmp_path,
                                                                          checkpoint):
    """What a kill -9 mid-save leaves (a ``.tmp-*`` folder, even one that looks complete) is not
    a checkpoint: resuming takes the last renamed one, and the leftover is removed."""
    import shutil

    data, path = checkpoint
    leftover = path.parent / ".tmp-0123abcd"
    shutil.copytree(path, leftover)
    state = json.loads((leftover / STATE_FILE).read_text())
    (leftover / STATE_FILE).write_text(json.dumps({**state, "step": 99}))
    result = train_policy(data, tiny, tmp_path / "r", checkpoint_dir=path.parent,
                          resume_from_checkpoint=True, progress=False,
                          config=GRPOConfig(learning_rate=1e-2, per_device_train_batch_size=2))
    assert result.steps == 2  # resumed after step 1 of 2, not "step 99"
    assert not leftover.exists()
    assert path.exists()
