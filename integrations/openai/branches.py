"""Tree sampling in the openai integration (``agl_bridge.branch``): the call asks for K choices,
every choice is recorded as a candidate of its agent-turn and scored, and the framework gets
the best one back as an ordinary one-choice response."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from agl_bridge import semconv as sc
from agl_bridge.branching import current_branch
from agl_bridge.errors import record_error
from agl_bridge.scope import candidate, current_scope, emit_reward

from .request import Call
from .response import choice_from_message, common_attributes, give_back, model_ids, record
from .utils import given

#: the name of the reward each candidate's score is recorded as (turn scope, its candidate)
SCORE_REWARD_NAME = "branch_score"


def prepare(call: Call) -> None:
    """Make this call the K-way request of the ``branch`` block in force, if one is waiting.

    A stream is not branched (the block waits for the next call that is not). Refused, before
    anything is sent: a call that already asks for several choices, and a scope without an agent
    and a turn (a candidate's reward is keyed by them)."""
    b = current_branch()
    if b is None or b.done or call.stream:
        return
    scope = current_scope()
    missing = [key for key in ("agent_name", "turn_index") if scope.get(key) is None]
    if missing:
        raise ValueError(f"agl_bridge.branch: the call's scope has no {' and no '.join(missing)}"
                         f"; wrap it in agl_bridge.agent(...) and agl_bridge.turn(...) (or use "
                         f"an integration that sets them)")
    n = call.kwargs.get("n")
    if given(n) and n != 1:
        raise ValueError(f"agl_bridge.branch: the call already asks for n={n} choices")
    call.kwargs = {**call.kwargs, "n": b.k}
    call.branch = b
    b.owner = (scope.get("agent_name"), scope.get("turn_index"))


def start_attributes(call: Call, attributes: dict[str, Any]) -> None:
    """At span start: keep a branched call's request attributes for its siblings, and mark a
    call made after the branch, in the same block by the same agent in the same turn, as the
    chosen candidate's."""
    if call.branch is not None:
        call.request_attributes = dict(attributes)
        return
    b = current_branch()
    if b is not None and b.done and b.chosen is not None:
        scope = current_scope()
        if (scope.get("agent_name"), scope.get("turn_index")) == b.owner:
            attributes[sc.CANDIDATE_INDEX] = b.chosen


def finish(tracer: trace.Tracer, span: trace.Span, result: Any, call: Call) -> Any:
    """Score the choices, record one candidate span each (the request's own span holds the
    chosen one), their scores as turn rewards, and give back the chosen choice alone."""
    b = call.branch
    assert b is not None
    choices = result.choices
    try:
        best = b.choose(choices)
    except BaseException as exc:  # the user's scorer failed: the call fails with its error
        record_error(span, exc, level=call.level)
        span.end()
        raise
    scores = b.scores or []
    take = call.take
    from_body = take is not None and take.absorbed > 0
    prompt = take.prompt_ids if from_body and take is not None else getattr(
        result, "prompt_token_ids", None)
    start = getattr(span, "start_time", None)
    for position, choice in enumerate(choices):
        rec = choice_from_message(choice)
        index = rec.index
        rec.index = 0  # each candidate is the one choice of its span
        attrs = common_attributes(call, response_id=getattr(result, "id", None),
                                  model=getattr(result, "model", None), choices=[rec],
                                  usage=getattr(result, "usage", None) if position == best
                                  else None)
        attrs.update({sc.CANDIDATE_INDEX: index, sc.BRANCH_SIZE: len(choices),
                      sc.BRANCH_SCORE: scores[position], sc.BRANCH_CHOSEN: position == best})
        if from_body and take is not None:
            ids, logprobs = take.choices.get(index, (None, None))
        else:
            ids, logprobs = model_ids(choice)
        target = span if position == best else tracer.start_span(
            getattr(span, "name", sc.chat_span_name(None)), kind=SpanKind.CLIENT,
            attributes=call.request_attributes, start_time=start)
        try:
            record(target, call, attrs, prompt, ids, logprobs)
        finally:
            target.end()
        with candidate(index):
            emit_reward(scores[position], scope=sc.RewardScope.TURN, name=SCORE_REWARD_NAME)
    give_back(result, call)
    chosen = choices[best]
    chosen.index = 0
    result.choices = [chosen]
    return result
