"""What the hot-swap tests on a real vLLM share: adapter versions trained on the tiny model, and an
agent that calls an alias until told to stop."""

import time

import openai
import pyarrow as pa

from agl_bridge.schema import TRANSITION_SCHEMA
from agl_bridge.trainer.training import GRPOConfig, train_policy


def versions(model_dir, root, n):
    out = []
    for v in range(n):
        rows = [{"episode_id": f"e{i}", "prompt_ids": [257, 40 + i + v], "completion_ids": [60, 61],
                 "completion_mask": [1, 1], "behaviour_logprobs": None,
                 "reward": float((i + v) % 2), "group_id": "g", "merged_calls": 1,
                 "retokenized": False} for i in range(4)]
        out.append(train_policy(pa.Table.from_pylist(rows, schema=TRANSITION_SCHEMA), model_dir,
                                root, adapter_name="team", progress=False,
                                config=GRPOConfig(learning_rate=5e-2, seed=v)).adapter_dir)
    return out


def call_alias_until(stop, base_url, record, errors, alias="team"):
    """An agent: asks ``alias`` until ``stop``; ``record(started, returned, model)`` per
    answer, the error of each failed call into ``errors``."""
    client = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0)
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            r = client.chat.completions.create(
                model=alias, max_tokens=4, temperature=0,
                messages=[{"role": "user", "content": "hi"}])
            record(t0, time.monotonic(), r.model)
        except Exception as exc:
            errors.append(repr(exc))
