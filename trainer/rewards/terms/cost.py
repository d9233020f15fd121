"""``cost``: what each LLM call cost, charged to the agent that made it::

    reward per call = per_token x tokens + per_second x seconds

``tokens`` as the coordination term counts them (``gen_ai.usage`` input and/or output tokens,
the call's token id lists where it has no usage attribute); ``seconds`` the span's duration
(0 for a span without an end, noted). Constants are added as written, so a cost is negative.
The reward goes to the call's agent and turn (per agent without a turn, to the episode without
an agent): the turn that spent the tokens pays for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge.trainer.arrow import arr
from agl_bridge.trainer.rewards.terms.base import (
    EPISODE_KEY,
    NO_EVALUATIONS,
    Derived,
    Evaluations,
    Readers,
    TableTerm,
    local_rewards,
)
from agl_bridge.trainer.rewards.terms.spans import TOKENS, call_tokens, is_chat

NO_END = "LLM call without an end time (latency 0)"


@dataclass(frozen=True)
class Cost(TableTerm):
    per_token: float = -0.001
    per_second: float = 0.0
    tokens: str = "input+output"
    weight: float = 1.0
    name: str = "cost"
    columns: tuple[str, ...] = ("operation_name", "attributes", "prompt_token_ids",
                                "completion_token_ids", "start_time_unix_nano",
                                "end_time_unix_nano", "agent_name", "turn_index")
    readers: ClassVar[Readers] = {"tokens": TOKENS}

    def __call__(self, spans: pa.Table, evaluations: Evaluations = NO_EVALUATIONS) -> Derived:
        out = Derived()
        mask = is_chat(spans)
        calls = spans.select([EPISODE_KEY, "agent_name", "turn_index", "start_time_unix_nano",
                              "end_time_unix_nano"]).filter(mask)
        if calls.num_rows == 0:
            return out
        value = np.zeros(calls.num_rows)
        if self.per_token:
            value += self.per_token * call_tokens(spans, self.tokens, mask)
        if self.per_second:
            ns = pc.subtract(calls["end_time_unix_nano"], calls["start_time_unix_nano"])
            out.note(self.name, NO_END, ns.null_count)
            value += self.per_second * np.maximum(np.asarray(
                pc.fill_null(ns, 0).to_numpy(zero_copy_only=False), np.float64), 0.0) / 1e9
        value *= self.weight
        out.rewards += local_rewards(arr(calls[EPISODE_KEY]), value, arr(calls["agent_name"]),
                                     arr(calls["turn_index"]), self.name)
        return out
