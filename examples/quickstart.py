"""The shortest way in: an ordinary agent program, captured with no tracing code.

    agl-bridge serve --model ./my-model --port 8000            # vLLM on http://127.0.0.1:8000/v1
    AGL_BRIDGE_AUTO=1 AGL_BRIDGE_PARQUET_DIR=traces/ python examples/quickstart.py \
        --base-url http://127.0.0.1:8000/v1 --model base
    agl-bridge convert traces/ transitions.parquet              # one transition per agent per turn
    agl-bridge train traces/ --base-model ./my-model            # a LoRA adapter, new version

Nothing here imports tracing: ``AGL_BRIDGE_AUTO=1`` switches capture on at start-up, and every
``chat.completions.create`` becomes a span with the token ids vLLM served. The two agl-bridge
calls say what training needs and the program alone knows: which calls form one attempt at a
task (``episode``) and how well it went (``emit_reward``).
"""

from __future__ import annotations

import argparse

import openai

import agl_bridge

QUESTIONS = {"q1": ("What is 2 + 3?", "5"), "q2": ("What is 7 + 6?", "13")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default="base")
    ap.add_argument("--attempts", type=int, default=2, help="episodes per question")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused")
    for task_id, (question, answer) in QUESTIONS.items():
        for _ in range(args.attempts):
            with agl_bridge.episode(task_id=task_id), agl_bridge.agent("solver"):
                reply = client.chat.completions.create(
                    model=args.model, messages=[{"role": "user", "content": question}],
                    max_tokens=16, temperature=1.0)
                text = reply.choices[0].message.content or ""
                agl_bridge.emit_reward(1.0 if answer in text else 0.0)
                print(f"{task_id}: {text!r}")


if __name__ == "__main__":
    main()
