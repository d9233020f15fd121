"""A two-agent team written with the plain openai client: a solver answers, a checker reviews.

This is "user code": it knows nothing of training. The only agl-bridge calls are the scoping API
(episode, agent, turn) and ``emit_reward``; capture is set up explicitly with
``agl_bridge.otel.configure_tracing`` below (``AGL_BRIDGE_AUTO=1`` would make even those two
lines unnecessary; see ``quickstart.py``).

The task is a toy with a verifiable reward a tiny random model can learn: answer a question
using as many lowercase letters as possible. Run with ``--help`` for options.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string

import openai

import agl_bridge


def reward_fn(answer: str) -> float:
    """Share of the answer's characters that are lowercase ASCII letters (0 for an empty one)."""
    if not answer:
        return 0.0
    return sum(ch in string.ascii_lowercase for ch in answer) / len(answer)


def make_tasks(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [(f"add-{seed}-{i}", f"What is {rng.randint(1, 50)} + {rng.randint(1, 50)}?")
            for i in range(n)]


def play_episode(client: openai.OpenAI, task_id: str, question: str, *, solver_model: str,
                 checker_model: str, temperature: float, max_tokens: int) -> float:
    with agl_bridge.episode(task_id=task_id):
        with agl_bridge.agent("solver", role="solver"), agl_bridge.turn(0):
            reply = client.chat.completions.create(
                model=solver_model, messages=[{"role": "user", "content": question}],
                temperature=temperature, max_tokens=max_tokens)
        answer = reply.choices[0].message.content or ""
        with agl_bridge.agent("checker", role="checker"), agl_bridge.turn(0):
            client.chat.completions.create(
                model=checker_model, temperature=temperature, max_tokens=max_tokens,
                messages=[{"role": "user",
                           "content": f"Question: {question}\nAnswer: {answer}\nCorrect?"}])
        reward = reward_fn(answer)
        agl_bridge.emit_reward(reward)
        return reward


def _wire_recorder(path: str):
    """An HTTP client that appends the token ids vLLM put on the wire to ``path`` (JSON lines),
    so a test can compare them with what the traces recorded, bypassing our instrumentor."""
    import httpx2

    def hook(response):
        if response.request.url.path.endswith("/chat/completions"):
            response.read()
            body = response.json()
            with open(path, "a") as f:
                f.write(json.dumps({"prompt_token_ids": body.get("prompt_token_ids"),
                                    "token_ids": body["choices"][0].get("token_ids")}) + "\n")

    return httpx2.Client(event_hooks={"response": [hook]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--solver-model", required=True)
    ap.add_argument("--checker-model", required=True)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=4, help="episodes per task (a GRPO group)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--record-wire-ids", help="append vLLM's raw token ids here (tests)")
    args = ap.parse_args()

    # Capture: Parquet into $AGL_BRIDGE_PARQUET_DIR, the openai client instrumented.
    from agl_bridge.integrations.openai import OpenAIInstrumentor
    from agl_bridge.otel import configure_tracing

    provider = configure_tracing(parquet_dir=os.environ["AGL_BRIDGE_PARQUET_DIR"])
    OpenAIInstrumentor().instrument()

    http_client = _wire_recorder(args.record_wire_ids) if args.record_wire_ids else None
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", http_client=http_client)
    rewards = [
        play_episode(client, task_id, question, solver_model=args.solver_model,
                     checker_model=args.checker_model, temperature=args.temperature,
                     max_tokens=args.max_tokens)
        for task_id, question in make_tasks(args.tasks, args.seed)
        for _ in range(args.rollouts)
    ]
    provider.shutdown()  # flushes the last batch of spans to Parquet
    print(json.dumps({"episodes": len(rewards), "mean_reward": sum(rewards) / len(rewards)}))


if __name__ == "__main__":
    main()
