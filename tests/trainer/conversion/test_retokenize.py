"""The retokenization fallback with a real tokenizer and chat template (the tiny model's)."""

import json

import pytest

from agl_bridge import semconv as sc
from agl_bridge.trainer.conversion import ConvertConfig, spans_to_transitions
from agl_bridge.trainer.conversion.retokenize import chat_messages
from agl_bridge.trainer.models.tiny import build_tiny_model
from tests.factories import llm, reward, table


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tok") / "m"))


def with_messages(row, question, answer, finish="stop"):
    row["attributes"] = json.dumps({
        sc.GEN_AI_INPUT_MESSAGES: json.dumps([{"role": "user", "parts": [
            {"type": "text", "content": question}]}]),
        sc.GEN_AI_OUTPUT_MESSAGES: json.dumps([{"role": "assistant", "finish_reason": finish,
                                                "parts": [{"type": "text", "content": answer}]}])})
    return row


def served_ids(tokenizer_dir, question, answer):
    """What vLLM returns for this exchange: the templated prompt, the answer and the stop."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": question}],
                                     add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    return list(prompt), tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]


def test_spans_without_ids_are_rebuilt_and_flagged(tokenizer_dir):
    rows = [with_messages(llm("e", 1, prompt=None, completion=None), "2+3?", "5"),
            llm("e", 2, agent="b"), reward("e", 3, 1.0)]
    out, stats = spans_to_transitions(table(rows), ConvertConfig(retokenize=tokenizer_dir))
    got = {r["agent_name"]: r for r in out.to_pylist()}
    prompt, completion = served_ids(tokenizer_dir, "2+3?", "5")
    assert got["a"]["retokenized"] is True and got["b"]["retokenized"] is False
    assert got["a"]["prompt_ids"] == prompt and got["a"]["completion_ids"] == completion
    assert got["a"]["completion_mask"] == [1] * len(completion)
    assert got["a"]["behaviour_logprobs"] is None
    assert stats.notes["ids rebuilt from messages (retokenized)"] == 1
    plain, plain_stats = spans_to_transitions(table(rows))  # without the option: skipped
    assert plain.num_rows == 1 and plain_stats.skipped["no token ids on the LLM span"] == 1


def test_agreement_with_recorded_ids_is_counted(tokenizer_dir):
    prompt, completion = served_ids(tokenizer_dir, "hi", "hello")
    good = with_messages(llm("e", 1, prompt=prompt, completion=completion), "hi", "hello")
    bad = with_messages(llm("e", 2, agent="b", prompt=prompt, completion=[7, 7]), "hi", "hello")
    out, stats = spans_to_transitions(table([good, bad, reward("e", 3, 1.0)]),
                                      ConvertConfig(retokenize=tokenizer_dir))
    assert stats.notes["retokenized prompt agrees with the recorded ids"] == 2
    assert stats.notes["retokenized completion agrees with the recorded ids"] == 1
    assert stats.notes["retokenized completion differs from the recorded ids"] == 1
    assert {r["retokenized"] for r in out.to_pylist()} == {False}  # recorded ids win


def test_genai_messages_map_back_to_chat_messages():
    genai = [{"role": "assistant", "parts": [
                {"type": "text", "content": "checking"},
                {"type": "tool_call", "id": "c1", "name": "calc", "arguments": "{\"x\": 1}"}]},
             {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1",
                                         "response": "2"}]}]
    assert chat_messages(genai) == [
        {"role": "assistant", "content": "checking", "tool_calls": [
            {"type": "function", "id": "c1", "function": {"name": "calc",
                                                          "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"}]
