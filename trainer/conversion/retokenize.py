"""Retokenization fallback: token ids rebuilt from captured messages, for spans without ids.

Training should use the ids the server saw and sampled (see the OpenAI instrumentor). When a
span has none (a server that is not vLLM, capture set up late) but its messages were captured
(``AGL_BRIDGE_CAPTURE=messages``), the ids can be rebuilt with the model's tokenizer and chat
template. They are an approximation: a completion decoded to text and encoded again need not
give the sampled ids back (byte-level tokens that are not valid UTF-8 on their own, merges the
sampler did not take), so every transition built this way is flagged ``retokenized``, and where
recorded ids exist the converter can count how often the rebuild disagrees with them.

``fill_ids`` runs before the converter: it fills the id columns where a span has none, and
the converter's one path does the rest.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc
from agl_bridge.schema import SPAN_SCHEMA
from agl_bridge.trainer.conversion import reasons
from agl_bridge.trainer.conversion.columns import RETOKENIZED
from agl_bridge.trainer.conversion.config import ConversionStats


def _text(parts: list[dict[str, Any]]) -> str:
    return "".join(p.get("content") or "" for p in parts if p.get("type") == "text")


def chat_messages(genai_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GenAI-convention messages (role + parts) -> chat-template messages (role + content)."""
    out: list[dict[str, Any]] = []
    for m in genai_messages:
        parts = m.get("parts") or []
        responses = [p for p in parts if p.get("type") == "tool_call_response"]
        if responses:
            out += [{"role": "tool", "tool_call_id": p.get("id"),
                     "content": p.get("response") if isinstance(p.get("response"), str)
                     else json.dumps(p.get("response"))} for p in responses]
            continue
        message: dict[str, Any] = {"role": m.get("role"), "content": _text(parts)}
        calls = [p for p in parts if p.get("type") == "tool_call"]
        if calls:
            message["tool_calls"] = [{"type": "function", "id": c.get("id"), "function": {
                "name": c.get("name"), "arguments": c.get("arguments") or "{}"}} for c in calls]
        out.append(message)
    return out


class Retokenizer:
    """Rebuilds (prompt ids, completion ids) from a span's captured messages."""

    def __init__(self, tokenizer_dir: str | os.PathLike[str]) -> None:
        from transformers import AutoTokenizer  # the train extra; only when asked for

        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))

    def ids(self, attributes: dict[str, Any]) -> tuple[list[int], list[int]] | None:
        """None when the span's attributes lack the messages to rebuild from."""
        raw_in = attributes.get(sc.GEN_AI_INPUT_MESSAGES)
        raw_out = attributes.get(sc.GEN_AI_OUTPUT_MESSAGES)
        if not raw_in or not raw_out:
            return None
        inputs = json.loads(raw_in) if isinstance(raw_in, str) else raw_in
        outputs = json.loads(raw_out) if isinstance(raw_out, str) else raw_out
        if not outputs:
            return None
        prompt: Any = self.tokenizer.apply_chat_template(
            chat_messages(inputs), add_generation_prompt=True, tokenize=True)
        if hasattr(prompt, "keys"):  # transformers 5 returns an encoding
            prompt = prompt["input_ids"]
        first = outputs[0]
        completion = self.tokenizer.encode(_text(first.get("parts") or []),
                                           add_special_tokens=False)
        if first.get("finish_reason") == "stop" and self.tokenizer.eos_token_id is not None:
            completion.append(self.tokenizer.eos_token_id)  # vLLM returns the stop token
        return list(prompt), list(completion)


def fill_ids(spans: pa.Table, tokenizer_dir: str | os.PathLike[str],
             stats: ConversionStats) -> pa.Table:
    """``spans`` with ids rebuilt from messages where an LLM span recorded none, flagged in a
    ``retokenized`` column; where it recorded ids, they are kept and the rebuild's agreement
    with them counted. The converter then treats the rebuilt ids as recorded ones (without
    logprobs: the sampler's are unknown). Later copies of a duplicated span are left to the
    converter's deduplication."""
    retokenizer = Retokenizer(tokenizer_dir)
    n = spans.num_rows
    is_llm = pc.fill_null(pc.equal(spans["operation_name"], sc.OP_CHAT), False).to_pylist()
    attributes = (spans["attributes"].to_pylist() if "attributes" in spans.column_names
                  else [None] * n)
    prompts = spans["prompt_token_ids"].to_pylist()
    completions = spans["completion_token_ids"].to_pylist()
    logprobs = (spans["completion_logprobs"].to_pylist()
                if "completion_logprobs" in spans.column_names else [None] * n)
    trace_ids, span_ids = spans["trace_id"].to_pylist(), spans["span_id"].to_pylist()
    flag = [False] * n
    seen: set[tuple[object, object]] = set()
    for i in range(n):
        ident = (trace_ids[i], span_ids[i])
        if not is_llm[i] or ident in seen:
            continue
        seen.add(ident)
        try:
            raw = attributes[i]
            rebuilt = retokenizer.ids(json.loads(raw) if raw else {})
        except (ValueError, TypeError, KeyError) as exc:
            stats.notes[reasons.retokenize_failed(type(exc).__name__)] += 1
            continue
        if rebuilt is None:
            continue
        if prompts[i] is not None and completions[i] is not None:
            stats.notes[reasons.retokenize_agreement("prompt", rebuilt[0] == prompts[i])] += 1
            stats.notes[reasons.retokenize_agreement(
                "completion", rebuilt[1] == completions[i])] += 1
            continue
        prompts[i], completions[i], logprobs[i] = rebuilt[0], rebuilt[1], None
        flag[i] = True
        stats.notes[reasons.RETOKENIZED] += 1
    if not any(flag):
        return spans
    out = spans
    for name, values in (("prompt_token_ids", prompts), ("completion_token_ids", completions),
                         ("completion_logprobs", logprobs)):
        typ = SPAN_SCHEMA.field(name).type
        column = pa.array(values, typ)
        if name in out.column_names:
            out = out.set_column(out.column_names.index(name), name, column)
        else:
            out = out.append_column(SPAN_SCHEMA.field(name), column)
    return out.append_column(pa.field(RETOKENIZED, pa.bool_()), pa.array(flag, pa.bool_()))
