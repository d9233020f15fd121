"""Retokenization fallback: token ids rebuilt from captured messages, for spans without ids.

Training should use the ids the server saw and sampled (see the OpenAI instrumentor). When a
span has none (a server that is not vLLM, capture set up late) but its messages were captured
(``AGL_BRIDGE_CAPTURE=messages``), the ids can be rebuilt with the model's tokenizer and chat
template. They are an approximation: a completion decoded to text and encoded again need not
give the sampled ids back (byte-level tokens that are not valid UTF-8 on their own, merges the
sampler did not take), so every transition built this way is flagged ``retokenized``, and where
recorded ids exist the converter can count how often the rebuild disagrees with them.
"""

from __future__ import annotations

import json
import os
from typing import Any

from agl_bridge import semconv as sc


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
        prompt = self.tokenizer.apply_chat_template(chat_messages(inputs),
                                                    add_generation_prompt=True, tokenize=True)
        if hasattr(prompt, "keys"):  # transformers 5 returns an encoding
            prompt = prompt["input_ids"]
        first = outputs[0]
        completion = self.tokenizer.encode(_text(first.get("parts") or []),
                                           add_special_tokens=False)
        if first.get("finish_reason") == "stop" and self.tokenizer.eos_token_id is not None:
            completion.append(self.tokenizer.eos_token_id)  # vLLM returns the stop token
        return list(prompt), list(completion)
