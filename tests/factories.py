"""Rows and tables for tests: span rows (one LLM call, one reward, a table of them) and
transition tables for the trainer."""

import json

import pyarrow as pa

from agl_bridge.schema import SPAN_SCHEMA, TRANSITION_SCHEMA

_N = iter(range(1, 10**9))


def llm(episode, t, *, task="t1", agent="a", prompt=(1, 2), completion=(3, 4), logprobs=None,
        trace="T", turn=0, candidate=None, round=None):
    return {"trace_id": trace, "span_id": f"s{next(_N)}", "name": "chat m", "episode_id": episode,
            "task_id": task, "agent_name": agent, "turn_index": turn,
            "candidate_index": candidate, "coordination_round": round, "operation_name": "chat",
            "start_time_unix_nano": t,
            "prompt_token_ids": None if prompt is None else list(prompt),
            "completion_token_ids": None if completion is None else list(completion),
            "completion_logprobs": logprobs}


def reward(episode, t, value, *, scope="episode", trace="T", agent=None, turn=None):
    return {"trace_id": trace, "span_id": f"s{next(_N)}", "name": "agl_bridge.reward",
            "episode_id": episode, "start_time_unix_nano": t, "reward_value": value,
            "reward_scope": scope, "agent_name": agent, "turn_index": turn}


def openinference_call(trace, t, session, question, answer):
    """An LLM call as OpenInference records it: messages in its own keys, the agent and the
    session as attributes, no episode, agent column or token ids."""
    attributes = {"openinference.span.kind": "LLM", "llm.model_name": "hosted",
                  "agent.name": "solver", "session.id": session,
                  "llm.input_messages.0.message.role": "system",
                  "llm.input_messages.0.message.content": "You are a helpful assistant.",
                  "llm.input_messages.1.message.role": "user",
                  "llm.input_messages.1.message.content": question,
                  "llm.output_messages.0.message.role": "assistant",
                  "llm.output_messages.0.message.content": answer}
    row = llm(None, t, task=None, agent=None, prompt=None, completion=None, trace=trace,
              turn=None)
    row.update(operation_name=None, attributes=json.dumps(attributes))
    return row


def table(rows):
    full = [{f.name: r.get(f.name) for f in SPAN_SCHEMA} for r in rows]
    return pa.Table.from_pylist(full, schema=SPAN_SCHEMA)


def transitions(rewards, groups=None, agents=None):
    rows = []
    for i, r in enumerate(rewards):
        rows.append({"episode_id": f"e{i}", "task_id": "t",
                     "agent_name": (agents or ["a"] * len(rewards))[i],
                     "prompt_ids": [257, 40 + i, 41, 258], "completion_ids": [60 + i, 61, 62],
                     "completion_mask": [1, 1, 1], "behaviour_logprobs": None, "reward": r,
                     "group_id": (groups or ["task:t"] * len(rewards))[i],
                     "advantage": None,
                     "merged_calls": 1, "retokenized": False})
    return pa.Table.from_pylist(rows, schema=TRANSITION_SCHEMA)
