"""Training (torch): transitions -> new LoRA adapter versions.

``config`` (GRPOConfig, TRL's names), ``data`` (micro-batches), ``model`` (the policy and its
log-probabilities), ``losses``, ``distributed`` (torchrun), ``checkpoints``, ``loop``
(``train_policy``), ``from_traces`` (``train_from_traces``: convert, then train), ``report``
(a run's metrics as a page; no torch). Names are imported on first use, so
``agl_bridge.trainer.training.report`` works without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "GRPOConfig": "config", "Policy": "config", "TrainResult": "config",
    "train_policy": "loop",
    "train_from_traces": "from_traces", "TrainRun": "from_traces",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
