"""The demo team as a production service: a stream of requests that never repeat, no reward.

``agl-bridge demo --production`` runs it beside the loop: the same AutoGen team
(``arith.py``), answering generated additions one after the other, each problem seen once, at
up to ``--concurrency`` at a time, for ``--minutes``. It emits no reward (production has none
at serving time) and writes what a service would log for its users: one JSON line per answered
request (``--log``) with the episode id and what was asked and answered. Capture is on
(``AGL_BRIDGE_AUTO=1``), the agents' model names resolve through the alias table, so the loop's
publishes reach it on the next request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import time
from collections.abc import Iterator

from agl_bridge.trainer.loop.teams.arith import AGENTS, play
from agl_bridge.trainer.loop.teams.program import model_client

QUESTION_SPACE = [(a, b) for a in range(2, 200) for b in range(2, 20)]


def problems(seed: int, exclude: set[tuple[int, int]]) -> Iterator[dict]:
    """Each problem of the space once, in a seeded random order, none of ``exclude``."""
    space = [p for p in QUESTION_SPACE if p not in exclude]
    random.Random(f"service-{seed}").shuffle(space)
    for n, (a, b) in enumerate(space):
        yield {"task_id": f"req-{n}-{a}+{b}", "a": a, "b": b, "kind": request_kind(a, b)}


def request_kind(a: int, b: int) -> str:
    """The kind of an addition, as a service would tag a request (its template, its intent):
    the digits of each number and whether the ones carry: 12 kinds, of different difficulty.
    ``--baseline key:demo.request_kind`` compares each episode with others of its kind."""
    carry = "carry" if a % 10 + b % 10 >= 10 else "no-carry"
    return f"{len(str(a))}+{len(str(b))} digits, {carry}"


async def serve(args: argparse.Namespace) -> int:
    exclude: set[tuple[int, int]] = set()
    for path in (args.exclude, args.log):  # held-out problems, and those served before
        if path and os.path.exists(path):
            with open(path) as f:
                exclude |= {(t["a"], t["b"]) for t in map(json.loads, f) if "a" in t}
    clients = {name: model_client(args.base_url, name, args.temperature, args.max_tokens)
               for name in AGENTS}
    sem = asyncio.Semaphore(args.concurrency)
    deadline = time.monotonic() + args.minutes * 60
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    served = 0
    gap = 1.0 / args.rate if args.rate > 0 else 0.0  # requests arrive at a steady rate
    next_at = time.monotonic()
    with open(args.log, "a") as log:
        pending: set[asyncio.Task] = set()
        for task in problems(args.seed, exclude):
            if stop.is_set() or time.monotonic() > deadline:
                break
            wait = next_at - time.monotonic()
            if wait > 0:
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                    break
                except asyncio.TimeoutError:
                    pass
            next_at = max(next_at + gap, time.monotonic())
            while len(pending) >= args.concurrency:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                served += _write(log, done)
            pending.add(asyncio.create_task(play(task, 0, clients, sem, args)))
        if pending:
            done, _ = await asyncio.wait(pending)
            served += _write(log, done)
    for client in clients.values():
        await client.close()
    print(json.dumps({"served": served}), flush=True)
    return 0


def _write(log, done: set[asyncio.Task]) -> int:
    n = 0
    for t in done:
        if t.exception() is not None:
            continue  # a failed request: the service goes on, as services do
        r = t.result()
        log.write(json.dumps({"episode_id": r["episode_id"], "task_id": r["task_id"],
                              "a": r["a"], "b": r["b"], "replies": r["replies"],
                              "correct": r["success"], "time": time.time()}) + "\n")
        n += 1
    log.flush()
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"))
    ap.add_argument("--log", required=True, help="one JSON line per answered request")
    ap.add_argument("--exclude", help="JSON lines of held-out problems (a, b) never served")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rate", type=float, default=1.0,
                    help="requests per second arriving (0: as fast as answered)")
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reward", choices=("add", "lower"), default="add",
                    help="what counts as a right answer in the log (lower: the toy task a "
                         "random tiny model can do)")
    args = ap.parse_args()
    args.no_reward = True
    raise SystemExit(asyncio.run(serve(args)))


if __name__ == "__main__":
    main()
