import asyncio
import math

import pytest

import agl_bridge
from agl_bridge import semconv as sc


def by_name(spans, name):
    return [s for s in spans.get_finished_spans() if s.name == name]


def test_nested_scopes_stamp_every_span_and_build_a_tree(spans):
    with agl_bridge.episode("ep-1", task_id="t-1") as ep:
        with agl_bridge.agent("solver", role="math"):
            with agl_bridge.turn(2), agl_bridge.candidate(1):
                agl_bridge.emit_reward(0.5, scope="turn", kind="tool", name="unit-tests")
    assert ep == "ep-1"
    (reward,) = by_name(spans, sc.SPAN_REWARD)
    assert dict(reward.attributes) == {
        sc.EPISODE_ID: "ep-1", sc.TASK_ID: "t-1", sc.GEN_AI_AGENT_NAME: "solver",
        sc.AGENT_ROLE: "math", sc.TURN_INDEX: 2, sc.CANDIDATE_INDEX: 1,
        sc.REWARD_VALUE: 0.5, sc.REWARD_SCOPE: "turn", sc.REWARD_KIND: "tool",
        sc.REWARD_NAME: "unit-tests",
    }
    (turn,) = by_name(spans, sc.SPAN_TURN)
    (agent,) = by_name(spans, "invoke_agent solver")
    (episode,) = by_name(spans, sc.SPAN_EPISODE)
    assert reward.parent.span_id == turn.context.span_id
    assert turn.parent.span_id == agent.context.span_id
    assert agent.parent.span_id == episode.context.span_id
    assert agent.attributes[sc.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert sc.TURN_INDEX not in agent.attributes  # scope is inherited downwards only


def test_scope_is_restored_after_the_block(spans):
    with agl_bridge.episode("outer"):
        with agl_bridge.agent("a"):
            pass
        agl_bridge.emit_reward(1.0)
    assert agl_bridge.current_scope() == {}
    (reward,) = by_name(spans, sc.SPAN_REWARD)
    assert reward.attributes[sc.EPISODE_ID] == "outer"
    assert sc.GEN_AI_AGENT_NAME not in reward.attributes


def test_episode_id_defaults_to_a_fresh_uuid():
    with agl_bridge.episode() as a, agl_bridge.episode() as b:
        assert len(a) == 32 and a != b


def test_concurrent_asyncio_tasks_keep_their_own_episode(spans):
    async def rollout(i):
        with agl_bridge.episode(f"ep-{i}"):
            await asyncio.sleep(0.01 * (3 - i))
            agl_bridge.emit_reward(float(i))

    async def main():
        await asyncio.gather(*(rollout(i) for i in range(3)))

    asyncio.run(main())
    got = {s.attributes[sc.EPISODE_ID]: s.attributes[sc.REWARD_VALUE]
           for s in by_name(spans, sc.SPAN_REWARD)}
    assert got == {"ep-0": 0.0, "ep-1": 1.0, "ep-2": 2.0}


@pytest.mark.parametrize("value, error, match", [
    (math.nan, ValueError, "finite"),
    (math.inf, ValueError, "finite"),
    ("1.0", TypeError, "real number"),
    ({"a": math.nan}, ValueError, "part .a. must be finite"),
    ({}, ValueError, "must not be empty"),
    (True, TypeError, "real number"),
])
def test_emit_reward_refuses_bad_values(spans, value, error, match):
    with pytest.raises(error, match=match):
        agl_bridge.emit_reward(value)
    assert by_name(spans, sc.SPAN_REWARD) == []


def test_emit_reward_refuses_unknown_scope_and_kind():
    with pytest.raises(ValueError, match="scope must be one of"):
        agl_bridge.emit_reward(1.0, scope="galaxy")
    with pytest.raises(ValueError, match="kind must be one of"):
        agl_bridge.emit_reward(1.0, kind="vibes")


def test_turn_and_candidate_refuse_bad_indices():
    with pytest.raises(ValueError, match="turn"):
        with agl_bridge.turn(-1):
            pass
    with pytest.raises(ValueError, match="candidate"):
        with agl_bridge.candidate("0"):
            pass
    with pytest.raises(ValueError, match="name"):
        with agl_bridge.agent(""):
            pass


def test_foreign_spans_get_the_scope_without_losing_their_own_attributes():
    """ScopeSpanProcessor, as frameworks' own spans meet it: stamped, never overriding, right
    after a scope changes, and stored exactly as set_attributes stores them."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agl_bridge.otel.processors import ScopeSpanProcessor

    memory = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attribute_length=4))
    provider.add_span_processor(ScopeSpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("autogen core")
    with agl_bridge.scope.scoped(episode_id="episode-1", agent_name="ab", turn_index=3):
        tracer.start_span("own", attributes={sc.GEN_AI_AGENT_NAME: "mine"}).end()
        with agl_bridge.scope.scoped(turn_index=4):
            tracer.start_span("next").end()
    tracer.start_span("outside").end()
    own, nxt, outside = (dict(s.attributes) for s in memory.get_finished_spans())
    # the framework's own agent name stays; the long episode id is cut to the span's value
    # limit, as the SDK's own path cuts it
    assert own == {sc.GEN_AI_AGENT_NAME: "mine", sc.EPISODE_ID: "epis", sc.TURN_INDEX: 3}
    assert nxt == {sc.EPISODE_ID: "epis", sc.GEN_AI_AGENT_NAME: "ab", sc.TURN_INDEX: 4}
    assert outside == {}


def test_set_scalars_stores_what_set_attributes_stores():
    from opentelemetry.sdk.trace import TracerProvider

    from agl_bridge.otel.attributes import set_scalars

    tracer = TracerProvider().get_tracer("t")
    values = {"s": "x", "b": True, "i": 2**70, "f": -0.5, "list": [1, 2], "none": None, "": 1}
    fast, slow = tracer.start_span("fast"), tracer.start_span("slow")
    set_scalars(fast, values)
    slow.set_attributes(values)
    assert dict(fast.attributes) == dict(slow.attributes)
    assert [type(v) for v in fast.attributes.values()] == \
        [type(v) for v in slow.attributes.values()]
    fast.end()
    set_scalars(fast, {"late": 1})  # an ended span: the SDK's own warning, nothing stored
    assert "late" not in fast.attributes


def test_scope_stamp_on_a_full_span_keeps_the_sdks_limit():
    """The stamp's one-update fast path is taken only where the span has room; a span at its
    attribute-count limit gets what set_attributes would leave (oldest dropped, counted)."""
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    from agl_bridge.otel.attributes import stamp_starting_span
    from agl_bridge.scope import plain_scalars

    tracer = TracerProvider(span_limits=SpanLimits(max_span_attributes=3)).get_tracer("t")
    stamp = {sc.EPISODE_ID: "e", sc.GEN_AI_AGENT_NAME: "a"}
    fast, slow = (tracer.start_span(n, attributes={"x": 1, "y": 2}) for n in ("fast", "slow"))
    stamp_starting_span(fast, stamp, plain_scalars(stamp))
    slow.set_attributes(stamp)
    assert dict(fast.attributes) == dict(slow.attributes)
    assert fast.dropped_attributes == slow.dropped_attributes == 1
