"""Spans written by other projects' instrumentors convert with retokenization
(``trainer/conversion/foreign.py``): the real packages from the registry drive a team against
the scripted server and export over OTLP to our receiver; recorded spans cover the forms the
installed versions no longer write (OpenLLMetry's flat ``gen_ai.prompt.N.*``, GenAI span
events) and bad input."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from agl_bridge import semconv as sc
from agl_bridge.trainer.conversion import ConvertConfig, convert, reasons, spans_to_transitions
from agl_bridge.trainer.conversion.foreign import GENAI_EVENTS, OPENINFERENCE, OPENLLMETRY
from tests.factories import llm, reward, table
from tests.feedback_runs import clean_env
from tests.paths import AGENTS
from tests.scripted_server import ScriptedServer
from tests.trainer.conversion.openllmetry_venv import build_openllmetry_python

TEAM = AGENTS / "foreign_team.py"


def template(tiny, messages, answer):
    """The ids a server would have seen and sampled for this exchange."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny))
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    return list(prompt), tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]


# -- the real instrumentors ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def old_openllmetry():
    return build_openllmetry_python()


@pytest.mark.parametrize("which", ["openai-v2", "openinference", "openllmetry",
                                   "openllmetry-0.40"])
def test_a_team_traced_by_another_instrumentor_trains_through_retokenization(tmp_path, start,
                                                                             tiny, which,
                                                                             request):
    python = sys.executable
    if which == "openllmetry-0.40":  # the flat gen_ai.prompt.N.* keys, from a venv of its own
        python, which = str(request.getfixturevalue("old_openllmetry")), "openllmetry"
        flat = True
    else:
        flat = False
    receiver = start()
    with ScriptedServer(vllm=False, reply="4") as server:
        run = subprocess.run([python, str(TEAM), which, server.base_url,
                              receiver.http_endpoint, "2"], capture_output=True, text=True,
                             env=clean_env(), timeout=120)
    assert run.returncode == 0, run.stderr
    tasks = [json.loads(line) for line in run.stdout.splitlines()]
    receiver.stop()

    out = tmp_path / "t.parquet"
    stats = convert(tmp_path / "out", out, ConvertConfig(retokenize=str(tiny)))
    rows = pq.read_table(out).to_pylist()
    assert sorted((r["episode_id"], r["agent_name"]) for r in rows) == sorted(
        (f"trace:{t['trace_id']}", agent) for t in tasks for agent in ("solver", "checker"))
    assert all(r["retokenized"] and r["behaviour_logprobs"] is None for r in rows)
    assert {r["episode_id"]: r["reward"] for r in rows} == {
        f"trace:{t['trace_id']}": float(i) for i, t in enumerate(tasks)}  # the team's score
    solver = next(r for r in rows if r["agent_name"] == "solver"
                  and r["episode_id"] == f"trace:{tasks[1]['trace_id']}")
    prompt, completion = template(tiny, [{"role": "system", "content": "You solve sums."},
                                         {"role": "user", "content": "What is 1 + 2?"}], "4")
    assert (solver["prompt_ids"], solver["completion_ids"]) == (prompt, completion)
    assert stats.notes[reasons.RETOKENIZED] == 4
    assert stats.notes[reasons.AGENT_FROM_ANCESTOR] == 4
    if which == "openinference":  # the others write gen_ai.input.messages, our own shape
        assert stats.notes[reasons.foreign_read(OPENINFERENCE)] == 4
    if flat:
        assert stats.notes[reasons.foreign_read(OPENLLMETRY)] == 4

    plain = convert(tmp_path / "out", tmp_path / "plain.parquet")  # no ids, no retokenization
    llm_calls_without_ids = 0 if which == "openinference" or flat else 4  # not chat yet
    assert plain.skipped.get(reasons.NO_TOKEN_IDS, 0) == llm_calls_without_ids
    assert pq.read_table(tmp_path / "plain.parquet").num_rows == 0


@pytest.mark.parametrize("which", ["openinference", "openai-v2", "openllmetry"])
@pytest.mark.parametrize("route", ["in memory", "spilled"])
def test_a_session_of_several_traces_is_one_episode(tmp_path, start, tiny, which, route):
    receiver = start()
    with ScriptedServer(vllm=False, reply="4") as server:
        run = subprocess.run([sys.executable, str(TEAM), which, server.base_url,
                              receiver.http_endpoint, "2", "chat-7"], capture_output=True,
                             text=True, env=clean_env(), timeout=120)
    assert run.returncode == 0, run.stderr
    traces = {json.loads(line)["trace_id"] for line in run.stdout.splitlines()}
    receiver.stop()
    assert len(traces) == 2

    out = tmp_path / "t.parquet"
    convert(tmp_path / "out", out, ConvertConfig(retokenize=str(tiny)),
            max_rows_in_memory=10_000 if route == "in memory" else 2)
    rows = pq.read_table(out).to_pylist()
    assert {r["episode_id"] for r in rows} == {"session:chat-7"}
    assert {r["trace_id"] for r in rows} == traces  # both requests, one episode
    assert sorted((r["agent_name"], r["turn_index"]) for r in rows) == [
        ("checker", 0), ("checker", 1), ("solver", 0), ("solver", 1)]
    # the team span's score names no call: the session's latest one counts, once
    assert {r["reward"] for r in rows} == {1.0}
    assert not list((tmp_path / "out").rglob("*session*"))  # the input is left as it was


# -- recorded spans -----------------------------------------------------------------------------
def foreign(trace, t, attributes, *, events=None, parent=None, span=None, operation=None):
    """A span as another instrumentor writes it: no episode, task, agent, ids."""
    row = llm(None, t, task=None, agent=None, prompt=None, completion=None, trace=trace,
              turn=None)
    row.update(operation_name=operation, attributes=json.dumps(attributes),
               events=json.dumps(events) if events else None, parent_span_id=parent)
    if span:
        row["span_id"] = span
    return row


def openllmetry_call(trace, parent, question, answer):
    """OpenLLMetry before gen_ai.input.messages: one flat key per message field."""
    return foreign(trace, 2, {"llm.request.type": "chat", "gen_ai.prompt.0.role": "user",
                              "gen_ai.prompt.0.content": question,
                              "gen_ai.completion.0.role": "assistant",
                              "gen_ai.completion.0.content": answer,
                              "gen_ai.completion.0.finish_reason": "stop"}, parent=parent,
                   operation="chat")


@pytest.mark.parametrize("route", ["in memory", "spilled"])
def test_openllmetry_flat_messages_under_an_agent_span_convert(tiny, tmp_path, route):
    trace = "a" * 32
    rows = [foreign(trace, 1, {"traceloop.span.kind": "agent", "traceloop.entity.name": "coder"},
                    span="1" * 16),
            openllmetry_call(trace, "1" * 16, "2+3?", "5"), reward(None, 3, 1.0, trace=trace)]
    if route == "in memory":
        out, stats = spans_to_transitions(table(rows), ConvertConfig(retokenize=str(tiny)))
    else:  # more rows than memory allows: buckets by episode, the agent span in the bucket
        pq.write_table(table(rows), tmp_path / "spans.parquet")
        stats = convert(tmp_path / "spans.parquet", tmp_path / "t.parquet",
                        ConvertConfig(retokenize=str(tiny)), max_rows_in_memory=1)
        out = pq.read_table(tmp_path / "t.parquet")
    (got,) = out.to_pylist()
    assert (got["episode_id"], got["agent_name"], got["reward"]) == (f"trace:{trace}", "coder",
                                                                     1.0)
    assert (got["prompt_ids"], got["completion_ids"]) == template(
        tiny, [{"role": "user", "content": "2+3?"}], "5")
    assert stats.notes[reasons.foreign_read(OPENLLMETRY)] == 1


def test_a_session_is_one_episode_in_a_table_too(tiny):
    """spans_to_transitions: gen_ai.conversation.id on one span of each trace; a score
    naming the session's second call goes to that call's turn."""
    calls = []
    for k, trace in enumerate(("1" * 32, "2" * 32)):
        calls.append(openllmetry_call(trace, None, f"q{k}", "a"))
        calls[-1]["agent_name"] = "a"
        calls[-1]["response_id"] = f"r{k}"
        calls.append(foreign(trace, 0, {sc.GEN_AI_CONVERSATION_ID: "c"}))
    score = {"trace_id": "3" * 32, "span_id": "9" * 16, "name": sc.GEN_AI_EVALUATION_RESULT,
             "start_time_unix_nano": 5, "evaluation_name": "helpful", "evaluation_score": 1.0,
             "response_id": "r1"}
    out, _ = spans_to_transitions(table([*calls, score]),
                                  ConvertConfig(retokenize=str(tiny), missing_reward=0.0))
    got = out.to_pylist()
    assert {r["episode_id"] for r in got} == {"session:c"}
    # one agent's calls in one episode: one turn, the second prompt did not extend the first
    assert sorted(r["reward"] for r in got) == [1.0, 1.0] and len(got) == 2


def test_openllmetry_content_parts_as_json_keep_their_text(tiny):
    """OpenLLMetry writes a message's list of content parts as JSON text."""
    trace = "e" * 32
    parts = json.dumps([{"type": "text", "text": "what is "}, {"type": "image_url"},
                        {"type": "text", "text": "this?"}])
    call = openllmetry_call(trace, None, parts, "a cat")
    call["agent_name"] = "a"
    out, _ = spans_to_transitions(table([call, reward(None, 3, 1.0, trace=trace)]),
                                  ConvertConfig(retokenize=str(tiny)))
    assert out["prompt_ids"].to_pylist() == [
        template(tiny, [{"role": "user", "content": "what is this?"}], "a cat")[0]]


def test_system_instructions_kept_apart_from_the_history_come_first(tiny):
    """gen_ai.system_instructions: the system prompt of an API that takes it apart."""
    trace = "f" * 32
    user = [{"role": "user", "parts": [{"type": "text", "content": "2+3?"}]}]
    answer = [{"role": "assistant", "finish_reason": "stop",
               "parts": [{"type": "text", "content": "5"}]}]
    call = foreign(trace, 1, {sc.GEN_AI_INPUT_MESSAGES: json.dumps(user),
                              sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(answer),
                              sc.GEN_AI_SYSTEM_INSTRUCTIONS: json.dumps(
                                  [{"type": "text", "content": "You add."}])},
                   operation="chat")
    call["agent_name"] = "a"
    broken = dict(call, span_id="2" * 16, attributes=json.dumps({
        sc.GEN_AI_INPUT_MESSAGES: json.dumps(user), sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(answer),
        sc.GEN_AI_SYSTEM_INSTRUCTIONS: "{"}), agent_name="b")
    out, stats = spans_to_transitions(table([call, broken, reward(None, 3, 1.0, trace=trace)]),
                                      ConvertConfig(retokenize=str(tiny)))
    got = {r["agent_name"]: r["prompt_ids"] for r in out.to_pylist()}
    assert got["a"] == template(tiny, [{"role": "system", "content": "You add."},
                                       {"role": "user", "content": "2+3?"}], "5")[0]
    # unreadable instructions are named; the call keeps the history it has
    assert got["b"] == template(tiny, [{"role": "user", "content": "2+3?"}], "5")[0]
    assert any(k.startswith(reasons.foreign_left_out(sc.GEN_AI_SYSTEM_INSTRUCTIONS, "not JSON")
                            [:-1]) for k in stats.notes)


def test_genai_span_events_and_tool_calls_convert(tiny):
    """The operation-details event (GenAI messages) and the older gen_ai.content.* pair."""
    trace = "b" * 32
    inputs = [{"role": "user", "parts": [{"type": "text", "content": "weather?"}]}]
    outputs = [{"role": "assistant", "finish_reason": "stop",
                "parts": [{"type": "text", "content": "sunny"}]}]
    details = foreign(trace, 1, {sc.GEN_AI_AGENT_NAME: "a"}, operation="chat", events=[
        {"name": sc.GEN_AI_OPERATION_DETAILS, "time_unix_nano": 1,
         "attributes": {sc.GEN_AI_INPUT_MESSAGES: inputs, sc.GEN_AI_OUTPUT_MESSAGES: outputs}}])
    details["agent_name"] = "a"
    openai_form = [{"role": "user", "content": "weather?"},
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"id": "c1", "type": "function",
                        "function": {"name": "look", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    legacy = foreign(trace, 2, {}, operation="chat", events=[
        {"name": sc.GEN_AI_CONTENT_PROMPT, "attributes": {sc.GEN_AI_PROMPT: json.dumps(
            openai_form)}},
        {"name": sc.GEN_AI_CONTENT_COMPLETION, "attributes": {sc.GEN_AI_COMPLETION: json.dumps(
            [{"role": "assistant", "content": "It is sunny.", "finish_reason": "stop"}])}}])
    legacy["agent_name"] = "b"
    rows = [details, legacy, reward(None, 3, 1.0, trace=trace)]
    out, stats = spans_to_transitions(table(rows), ConvertConfig(retokenize=str(tiny)))
    got = {r["agent_name"]: r for r in out.to_pylist()}
    assert got["a"]["prompt_ids"] == template(tiny, [{"role": "user", "content": "weather?"}],
                                              "sunny")[0]
    expected = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "id": "c1",
                     "function": {"name": "look", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    assert (got["b"]["prompt_ids"], got["b"]["completion_ids"]) == template(
        tiny, expected, "It is sunny.")
    assert stats.notes[reasons.foreign_read(GENAI_EVENTS)] == 2


def test_openinference_multimodal_contents_and_agent_name_convert(tiny):
    trace = "c" * 32
    attributes = {"openinference.span.kind": "LLM", "llm.model_name": "m", "agent.name": "vision",
                  "llm.input_messages.0.message.role": "user",
                  "llm.input_messages.0.message.contents.0.message_content.type": "text",
                  "llm.input_messages.0.message.contents.0.message_content.text": "what is ",
                  "llm.input_messages.0.message.contents.1.message_content.type": "image",
                  "llm.input_messages.0.message.contents.2.message_content.type": "text",
                  "llm.input_messages.0.message.contents.2.message_content.text": "this?",
                  "llm.output_messages.0.message.role": "assistant",
                  "llm.output_messages.0.message.content": "a cat"}
    rows = [foreign(trace, 1, attributes), reward(None, 3, 1.0, trace=trace)]
    out, _ = spans_to_transitions(table(rows), ConvertConfig(retokenize=str(tiny)))
    (got,) = out.to_pylist()
    assert (got["agent_name"], got["request_model"]) == ("vision", "m")
    prompt, completion = template(tiny, [{"role": "user", "content": "what is this?"}], "a cat")
    # no finish reason recorded (no output.value): no stop token is guessed
    assert (got["prompt_ids"], got["completion_ids"]) == (prompt, completion[:-1])


def test_unreadable_foreign_messages_are_named_and_skipped_the_rest_converts(tiny):
    trace = "d" * 32
    no_role = openllmetry_call(trace, None, "q", "a")
    del_role = json.loads(no_role["attributes"])
    del del_role["gen_ai.prompt.0.role"]
    no_role["attributes"] = json.dumps(del_role)
    bad_index = foreign(trace, 4, {"openinference.span.kind": "LLM",
                                   "llm.input_messages.x.message.role": "user"})
    not_text = foreign(trace, 5, {"openinference.span.kind": "LLM",
                                  "llm.input_messages.0.message.role": "user",
                                  "llm.input_messages.0.message.content": 7,
                                  "llm.output_messages.0.message.role": "assistant"})
    bad_event = foreign(trace, 6, {}, operation="chat", events=[
        {"name": sc.GEN_AI_CONTENT_PROMPT, "attributes": {sc.GEN_AI_PROMPT: "[{not json"}}])
    good = openllmetry_call(trace, None, "2+3?", "5")
    rows = [no_role, bad_index, not_text, bad_event, good, reward(None, 9, 1.0, trace=trace)]
    out, stats = spans_to_transitions(table(rows), ConvertConfig(retokenize=str(tiny)))
    assert out.num_rows == 1 and out["completion_ids"].to_pylist() == [
        template(tiny, [{"role": "user", "content": "5"}], "5")[1]]
    assert stats.notes[reasons.foreign_unreadable(
        OPENLLMETRY, "gen_ai.prompt.0.role", "no role")] == 1
    assert stats.notes[reasons.foreign_unreadable(
        OPENINFERENCE, "llm.input_messages.x.message.role",
        "not llm.input_messages.<index>.<field>")
    ] == 1
    assert stats.notes[reasons.foreign_unreadable(
        OPENINFERENCE, "llm.input_messages.0.message.content", "content is int, not text")] == 1
    assert any(k.startswith(reasons.foreign_unreadable(
        GENAI_EVENTS, f"{sc.GEN_AI_CONTENT_PROMPT} event: {sc.GEN_AI_PROMPT}", "not JSON"
    )[:-1]) for k in stats.notes)
    assert stats.skipped[reasons.NO_TOKEN_IDS] == 4  # each named above, none converted
