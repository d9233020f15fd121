"""agl-bridge: train multi-agent LLM systems with RL from their own OpenTelemetry traces.

The top level holds only what capture needs (no torch): the scoping API, rewards, tools and the
coordination vocabulary. Training lives in ``agl_bridge.trainer`` (the ``train`` extra), export
in ``agl_bridge.otel``.
"""

from agl_bridge._version import __version__
from agl_bridge.branching import branch
from agl_bridge.capture import CaptureLevel, capture_level
from agl_bridge.coordination import (
    final_selection,
    new_answer,
    restart,
    task_step,
    vote,
    workflow,
)
from agl_bridge.feedback import current_episode_id, current_trace_id, feedback, flush_feedback
from agl_bridge.scope import (
    agent,
    candidate,
    coordination_round,
    current_scope,
    emit_reward,
    episode,
    turn,
)
from agl_bridge.tools import tool


def train_from_traces(traces, base_model, **kwargs):
    """Convert traces and train LoRA adapters; see
    ``agl_bridge.trainer.training.from_traces.train_from_traces``.

    Imported on call, so that capture never imports torch.
    """
    from agl_bridge.trainer.training.from_traces import train_from_traces as run

    return run(traces, base_model, **kwargs)

__all__ = [
    "CaptureLevel",
    "__version__",
    "agent",
    "branch",
    "candidate",
    "capture_level",
    "coordination_round",
    "current_episode_id",
    "current_scope",
    "current_trace_id",
    "emit_reward",
    "episode",
    "feedback",
    "final_selection",
    "flush_feedback",
    "new_answer",
    "restart",
    "task_step",
    "tool",
    "train_from_traces",
    "turn",
    "vote",
    "workflow",
]
