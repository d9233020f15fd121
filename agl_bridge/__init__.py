"""agl-bridge: train multi-agent LLM systems with RL from their own OpenTelemetry traces.

The top level holds only what capture needs (no torch): the scoping API and rewards. Training
lives in ``agl_bridge.trainer`` (the ``train`` extra), export in ``agl_bridge.otel``.
"""

from agl_bridge._version import __version__
from agl_bridge.scope import (
    agent,
    candidate,
    current_scope,
    emit_reward,
    episode,
    turn,
)

__all__ = [
    "__version__",
    "agent",
    "candidate",
    "current_scope",
    "emit_reward",
    "episode",
    "turn",
]
