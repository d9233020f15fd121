"""An evaluation record's attributes, checked: what ``agl_bridge.feedback`` sends and
``agl-bridge feedback FILE`` (``agl_bridge.otel.feedback_files``) and the judges
(``agl_bridge.trainer.judging``) write.

The record is OpenTelemetry's ``gen_ai.evaluation.result`` (``gen_ai.evaluation.name``,
``.score.value``, ``.score.label``, ``.explanation``) with the id of what it scores
(``target_of``) and where the score came from. Pure: no SDK, no Parquet; turning the attributes
into a span row is ``agl_bridge.otel.rows.evaluation_row``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agl_bridge import semconv as sc
from agl_bridge.capture import capture_messages

_PREFIXES = (sc.TARGET_EPISODE, sc.TARGET_TRACE, sc.TARGET_RESPONSE)
DEFAULT_NAME = "feedback"
ANY_TARGET = "any"  # the prefix of a target whose kind was not said


def target_of(target: str) -> str:
    """The stored target: ``kind:id`` (``any:id`` when the kind was not said)."""
    if not isinstance(target, str) or not target.strip():
        raise ValueError(f"feedback: target must be a non-empty id string, got {target!r}")
    kind, sep, rest = target.partition(":")
    if sep and kind in _PREFIXES:
        if not rest:
            raise ValueError(f"feedback: target {target!r} has no id after its prefix")
        if kind == sc.TARGET_TRACE and not _is_trace_id(rest):
            raise ValueError(f"feedback: {target!r} is not a trace id (32 hex digits)")
        return f"{kind}:{rest.lower() if kind == sc.TARGET_TRACE else rest}"
    return f"{ANY_TARGET}:{target}"


def _is_trace_id(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdefABCDEF" for c in text) \
        and text.strip("0") != ""


def evaluation_attributes(target: str, value: float | Mapping[str, float], *,
                          name: str | None = None, kind: str = sc.RewardKind.HUMAN,
                          agent: str | None = None, label: str | None = None,
                          explanation: str | None = None) -> dict[str, Any]:
    """The attributes of one evaluation record (checked: bad input raises here, at the call)."""
    from agl_bridge.scope import score_parts

    score, parts = score_parts(value, "feedback")
    if kind not in sc.RewardKind.ALL:
        raise ValueError(f"feedback: kind must be one of {sc.RewardKind.ALL}, got {kind!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"feedback: name must be a non-empty string, got {name!r}")
    if agent is not None and (not isinstance(agent, str) or not agent):
        raise ValueError(f"feedback: agent must be a non-empty string, got {agent!r}")
    attributes: dict[str, Any] = {
        sc.GEN_AI_EVALUATION_NAME: name or DEFAULT_NAME,
        sc.GEN_AI_EVALUATION_SCORE_VALUE: score,
        sc.EVALUATION_TARGET: target_of(target),
        sc.REWARD_KIND: kind,
    }  # no scope: what the target names decides it at conversion (a response id: its turn)
    if agent:
        attributes[sc.GEN_AI_AGENT_NAME] = agent
    if label is not None:
        attributes[sc.GEN_AI_EVALUATION_SCORE_LABEL] = str(label)
    if explanation is not None and capture_messages():  # free text: the messages level only
        attributes[sc.GEN_AI_EVALUATION_EXPLANATION] = str(explanation)
    attributes.update({sc.reward_part_attribute(p): v for p, v in parts.items()})
    return attributes
