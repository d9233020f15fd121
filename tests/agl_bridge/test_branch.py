"""Tree sampling (``agl_bridge.branch``): one request for K choices, every choice recorded as a
candidate with its own ids, the best-scored one returned, and the candidates grouped and
rewarded by their scores at conversion."""

import asyncio
import math

import openai
import pyarrow.parquet as pq
import pytest
from opentelemetry.trace import StatusCode

import agl_bridge
from agl_bridge import semconv as sc
from agl_bridge.trainer.conversion import ConvertConfig, convert
from tests.scripted_server import ScriptedServer
from tests.span_files import spans_to_table

MESSAGES = [{"role": "user", "content": "What is 7+8?"}]
REPLIES = ["12", "13", "15", "14"]


def closeness(choice) -> float:
    """A turn-level scorer: how close the answer is to 15."""
    return -abs(int(choice.message.content) - 15)


def chat(spans):
    return sorted((s for s in spans.get_finished_spans() if s.name.startswith("chat")),
                  key=lambda s: s.attributes.get(sc.CANDIDATE_INDEX, -1))


def rewards(spans):
    return [s for s in spans.get_finished_spans() if s.name == sc.SPAN_REWARD]


def test_one_request_k_candidates_each_with_its_ids_and_the_best_returned(spans, instrumented):
    with ScriptedServer(vllm=True, completion_ids=[7, 8, 9], choice_replies=REPLIES) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with agl_bridge.episode("e1", task_id="t1"), agl_bridge.agent("solver"), \
                agl_bridge.turn(0), agl_bridge.branch(4, closeness) as b:
            response = client.chat.completions.create(model="m", messages=MESSAGES)
            follow_up = client.chat.completions.create(model="m", messages=MESSAGES)
    first, second = server.requests
    assert first["n"] == 4 and "n" not in second  # one request for all four; then plain
    # the framework sees one ordinary choice: the best-scored, renumbered 0, no fields we added
    assert [c.message.content for c in response.choices] == ["15"]
    assert response.choices[0].index == 0 and response.choices[0].token_ids is None
    assert response.choices[0].logprobs is None and response.prompt_token_ids is None
    assert b.scores == [-3.0, -2.0, 0.0, -1.0] and b.chosen == 2
    assert follow_up.choices[0].message.content == "12"  # not branched: the server's first

    candidates = [s for s in chat(spans) if sc.BRANCH_SIZE in s.attributes]
    (after,) = [s for s in chat(spans) if sc.BRANCH_SIZE not in s.attributes]
    assert after.attributes[sc.CANDIDATE_INDEX] == 2  # the block goes on as the chosen one
    assert len(candidates) == 4
    assert [s.attributes[sc.CANDIDATE_INDEX] for s in candidates] == [0, 1, 2, 3]
    for i, s in enumerate(candidates):
        a = s.attributes
        assert list(a[sc.COMPLETION_TOKEN_IDS]) == [7 + 100 * i, 8 + 100 * i, 9 + 100 * i]
        assert list(a[sc.COMPLETION_LOGPROBS]) == [-0.5, -0.75, -1.0]
        assert list(a[sc.PROMPT_TOKEN_IDS]) == [1, 2, 3, 1]
        assert a[sc.BRANCH_SIZE] == 4 and a[sc.BRANCH_SCORE] == b.scores[i]
        assert a[sc.BRANCH_CHOSEN] is (i == 2)
        assert (a[sc.EPISODE_ID], a[sc.GEN_AI_AGENT_NAME], a[sc.TURN_INDEX]) == ("e1", "solver", 0)
        assert a[sc.GEN_AI_REQUEST_CHOICE_COUNT] == 4
        assert s.parent == candidates[2].parent  # siblings
    assert sum(sc.GEN_AI_USAGE_INPUT_TOKENS in s.attributes for s in candidates) == 1
    scored = sorted((r.attributes[sc.CANDIDATE_INDEX], r.attributes[sc.REWARD_VALUE],
                     r.attributes[sc.REWARD_SCOPE]) for r in rewards(spans))
    assert scored == [(0, -3.0, "turn"), (1, -2.0, "turn"), (2, 0.0, "turn"), (3, -1.0, "turn")]


def test_candidates_convert_to_one_group_rewarded_by_their_scores(spans, instrumented,
                                                                   tmp_path):
    with ScriptedServer(vllm=True, completion_ids=[7, 8, 9], choice_replies=REPLIES) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with agl_bridge.episode("e1", task_id="t1"):
            with agl_bridge.agent("solver"), agl_bridge.turn(0), agl_bridge.branch(4, closeness):
                client.chat.completions.create(model="m", messages=MESSAGES)
            agl_bridge.emit_reward(1.0)  # the team's reward: the same for every candidate
    pq.write_table(spans_to_table(spans.get_finished_spans()), tmp_path / "spans.parquet")
    stats = convert(tmp_path / "spans.parquet", tmp_path / "t.parquet",
                    ConvertConfig(algorithm="at_grpo", alpha=1.0))
    t = pq.read_table(tmp_path / "t.parquet").sort_by("candidate_index").to_pylist()
    assert stats.transitions == 4 and len({r["group_id"] for r in t}) == 1
    assert [r["candidate_index"] for r in t] == [0, 1, 2, 3]
    assert [r["reward"] for r in t] == [1.0 - 3, 1.0 - 2, 1.0 + 0, 1.0 - 1]
    assert [r["completion_ids"][0] for r in t] == [7, 107, 207, 307]  # each its own ids
    best = max(t, key=lambda r: r["advantage"])
    assert best["candidate_index"] == 2 and math.isclose(sum(r["advantage"] for r in t), 0.0,
                                                         abs_tol=1e-9)


def test_later_calls_are_the_chosen_candidates_only_for_the_same_agent_and_turn(
        spans, instrumented):
    with ScriptedServer(vllm=True, choice_replies=REPLIES) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with agl_bridge.branch(4, closeness):  # a team run wrapped whole
            with agl_bridge.agent("reader"), agl_bridge.turn(0):
                client.chat.completions.create(model="m", messages=MESSAGES)
            with agl_bridge.agent("solver"), agl_bridge.turn(0):
                client.chat.completions.create(model="m", messages=MESSAGES)
            with agl_bridge.agent("reader"), agl_bridge.turn(1):
                client.chat.completions.create(model="m", messages=MESSAGES)
    assert [b.get("n") for b in server.requests] == [4, None, None]
    plain = [s for s in chat(spans) if sc.BRANCH_SIZE not in s.attributes]
    assert [sc.CANDIDATE_INDEX in s.attributes for s in plain] == [False, False]


def test_async_calls_branch_too(spans, instrumented):
    async def run():
        with ScriptedServer(vllm=True, choice_replies=REPLIES) as server:
            client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k")
            with agl_bridge.agent("solver"), agl_bridge.turn(3), \
                    agl_bridge.branch(3, closeness) as b:
                response = await client.chat.completions.create(model="m", messages=MESSAGES)
            return server.requests, response, b

    (body,), response, b = asyncio.run(run())
    assert body["n"] == 3 and response.choices[0].message.content == "15" and b.chosen == 2
    assert len(chat(spans)) == 3


def test_refusals_say_what_is_wrong_and_send_nothing(spans, instrumented):
    with pytest.raises(ValueError, match="k must be an int >= 2"):
        with agl_bridge.branch(1, closeness):
            pass
    with pytest.raises(TypeError, match="score must be callable"):
        with agl_bridge.branch(2, 0.5):  # type: ignore[arg-type]
            pass
    with ScriptedServer(vllm=True, choice_replies=REPLIES) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with agl_bridge.agent("solver"), agl_bridge.branch(2, closeness):
            with pytest.raises(ValueError, match="scope has no turn_index"):
                client.chat.completions.create(model="m", messages=MESSAGES)
        with agl_bridge.agent("solver"), agl_bridge.turn(0), agl_bridge.branch(2, closeness):
            with pytest.raises(ValueError, match="already asks for n=2"):
                client.chat.completions.create(model="m", messages=MESSAGES, n=2)
        assert server.requests == []
        with agl_bridge.agent("solver"), agl_bridge.turn(0), \
                agl_bridge.branch(2, lambda c: math.nan):
            with pytest.raises(ValueError, match=r"score\(\) of choice 0 must be finite, got nan"):
                client.chat.completions.create(model="m", messages=MESSAGES)
        with agl_bridge.agent("solver"), agl_bridge.turn(0), \
                agl_bridge.branch(2, lambda c: "high"):
            with pytest.raises(TypeError, match=r"choice 0 must be a real number, got str"):
                client.chat.completions.create(model="m", messages=MESSAGES)
    failed = chat(spans)
    assert len(failed) == 2 and all(s.status.status_code == StatusCode.ERROR
                                    and s.end_time is not None for s in failed)


def test_a_stream_is_not_branched_and_the_block_waits_for_the_next_call(spans, instrumented):
    with ScriptedServer(vllm=True, choice_replies=REPLIES) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k")
        with agl_bridge.agent("solver"), agl_bridge.turn(0), \
                agl_bridge.branch(2, closeness) as b:
            stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            assert not b.done
            client.chat.completions.create(model="m", messages=MESSAGES)
    assert "n" not in server.requests[0] and server.requests[1]["n"] == 2
    assert b.chosen == 1  # "13" is closer to 15 than "12"


def test_the_block_ends_cleanly_outside_any_call():
    assert agl_bridge.branching.current_branch() is None
    with agl_bridge.branch(2, closeness) as b:
        assert agl_bridge.branching.current_branch() is b and not b.done
    assert agl_bridge.branching.current_branch() is None
