"""An evaluation record's attributes (``agl_bridge/evaluations.py``): what ``feedback``,
``agl-bridge feedback FILE`` and the judges all write, checked at the call."""

import pytest

from agl_bridge import semconv as sc
from agl_bridge.evaluations import evaluation_attributes, target_of


def test_targets_keep_their_kind_and_trace_ids_are_lowercased():
    trace = "AB" * 16
    assert target_of("episode:e1") == "episode:e1"
    assert target_of("response:chatcmpl-1") == "response:chatcmpl-1"
    assert target_of(f"trace:{trace}") == f"trace:{trace.lower()}"
    assert target_of("e1") == "any:e1"  # the converter tries each kind
    assert target_of("ticket:7") == "any:ticket:7"  # not a prefix we know: part of the id


@pytest.mark.parametrize("target", ["", "  ", "episode:", "trace:xyz", "trace:" + "0" * 32, 5])
def test_bad_targets_are_refused(target):
    with pytest.raises(ValueError, match="feedback:"):
        target_of(target)


def test_parts_are_summed_and_kept_and_the_target_decides_the_scope():
    attributes = evaluation_attributes("e1", {"helpful": 0.5, "polite": 0.25}, name="ticket",
                                       agent="writer", label="good")
    assert attributes[sc.GEN_AI_EVALUATION_SCORE_VALUE] == 0.75
    assert attributes[sc.reward_part_attribute("helpful")] == 0.5
    assert attributes[sc.GEN_AI_EVALUATION_NAME] == "ticket"
    assert attributes[sc.EVALUATION_TARGET] == "any:e1"
    assert attributes[sc.REWARD_KIND] == sc.RewardKind.HUMAN
    assert sc.REWARD_SCOPE not in attributes  # conversion: a response id scores its turn
    assert attributes[sc.GEN_AI_AGENT_NAME] == "writer"
    assert attributes[sc.GEN_AI_EVALUATION_SCORE_LABEL] == "good"
    plain = evaluation_attributes("e1", 1)
    assert plain[sc.GEN_AI_EVALUATION_NAME] == "feedback"
    assert sc.REWARD_SCOPE not in plain


def test_explanations_are_kept_at_the_messages_level_only(monkeypatch):
    monkeypatch.setenv("AGL_BRIDGE_CAPTURE", "token_ids")
    assert sc.GEN_AI_EVALUATION_EXPLANATION not in evaluation_attributes("e", 1, explanation="x")
    monkeypatch.setenv("AGL_BRIDGE_CAPTURE", "messages")
    assert evaluation_attributes("e", 1, explanation="x")[sc.GEN_AI_EVALUATION_EXPLANATION] == "x"


@pytest.mark.parametrize("value, options", [
    (float("nan"), {}), ({}, {}), ({"": 1.0}, {}), ("1", {}),
    (1.0, {"kind": "vibes"}), (1.0, {"name": ""}), (1.0, {"agent": ""}),
])
def test_bad_scores_and_options_are_refused(value, options):
    with pytest.raises((TypeError, ValueError), match="feedback:"):
        evaluation_attributes("e", value, **options)
