"""A publisher in a process of its own, for the tests of publishing under concurrency.

``python tests/publish_worker.py REGISTRY SERVER ALIAS GO_FILE DIR...`` prints ``ready``, waits
until GO_FILE exists (so that every worker starts publishing at once), publishes each adapter
directory under ALIAS in the order given, printing each served name, and exits 0.

``--block-in-commit`` makes the worker stop for good inside its first alias switch, after
printing ``in-commit``: the registry's lock is held there, so a test can kill -9 it at that
point and check that the next publisher is not blocked.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from agl_bridge.aliases import AliasTable
from agl_bridge.trainer.serving.publisher import Publisher


def main(argv: list[str]) -> int:
    block = "--block-in-commit" in argv
    registry, server, alias, go, *dirs = [a for a in argv if a != "--block-in-commit"]
    if block:
        def stuck(self, aliases):  # stands in for AliasTable.write
            print("in-commit", flush=True)
            time.sleep(3600)
        AliasTable.write = stuck
    publisher = Publisher([server], Path(registry), drain_s=0.0, timeout_s=30.0)
    print("ready", flush=True)
    while not Path(go).exists():
        time.sleep(0.005)
    for d in dirs:
        print(publisher.publish(d, alias=alias), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
