"""Simulated users of the demo service: some send feedback, later, from another process.

``agl-bridge demo --production`` runs it beside the service: it follows the service's log of
answered requests and, for a ``--share`` of them (chosen at random), waits a random delay
(``--delay-s MIN MAX``: people answer later, not at once) and sends ``agl_bridge.feedback``
for that episode: 1.0 when the team's final line has the right sum, else 0.0, as a user's
thumbs up or down would. The rest get no feedback. Scores are written durably to the
service's trace directory (``--out``), where conversion joins them to their episodes.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import signal
import time
from pathlib import Path

import agl_bridge

FLUSH_S = 10.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", required=True, help="the service's log of answered requests")
    ap.add_argument("--out", required=True, help="the span directory to write feedback to")
    ap.add_argument("--share", type=float, default=0.5, help="requests that get feedback")
    ap.add_argument("--delay-s", type=float, nargs=2, default=(5.0, 30.0), metavar=("MIN", "MAX"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(f"users-{args.seed}")
    stop = False

    def halt(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, halt)
    due: list[tuple[float, str, float]] = []  # (when, episode, value)
    offset, sent, seen = 0, 0, 0
    flushed = time.monotonic()
    log = Path(args.log)
    while not stop:
        if log.exists():
            with open(log) as f:
                f.seek(offset)
                for line in f:
                    if not line.endswith("\n"):
                        break  # a line still being written: read it next time
                    offset += len(line.encode())
                    row = json.loads(line)
                    seen += 1
                    if rng.random() < args.share:
                        when = time.time() + rng.uniform(*args.delay_s)
                        heapq.heappush(due, (when, row["episode_id"], float(row["correct"])))
        while due and due[0][0] <= time.time():
            _, episode, value = heapq.heappop(due)
            agl_bridge.feedback("episode:" + episode, value, name="thumbs", out=args.out)
            sent += 1
        if time.monotonic() - flushed >= FLUSH_S:  # visible to conversion, in few files
            agl_bridge.flush_feedback()
            flushed = time.monotonic()
        time.sleep(1.0)
    agl_bridge.flush_feedback()
    print(json.dumps({"seen": seen, "feedback_sent": sent}), flush=True)


if __name__ == "__main__":
    main()
