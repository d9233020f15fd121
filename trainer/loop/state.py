"""The loop's state file: settings, finished stages and their results, written atomically after
each stage, so a loop stopped at any point (Ctrl-C, kill, a crash) goes on from there."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agl_bridge.settings import paths_values, replace_text

STATE_FILE = "state.json"
# settings a resumed run may change: the budget
BUDGET = ("rounds", "minutes")


LOOP_LOCK = ".loop.lock"  # held by the loop that runs here (engine._exclusive)


def wipe(directory: Path, keep: Collection[str] = ()) -> None:
    """Everything under ``directory`` but the held locks (``LOOP_LOCK``): deleting a lock file
    while it is held would let a second loop lock a new one. ``keep``: names of entries of
    ``directory`` itself to leave as they are."""
    for entry in directory.iterdir():
        if entry.name in keep:
            continue
        if entry.is_dir() and not entry.is_symlink():
            wipe(entry)
            if not any(entry.iterdir()):
                entry.rmdir()
        elif entry.name != LOOP_LOCK:
            entry.unlink()


class LoopState:
    """``<workdir>/state.json``. ``data`` holds ``settings``, ``rounds`` (one record per
    finished round), ``seconds`` (per stage), ``resumed`` (how often), and what the stages add."""

    def __init__(self, workdir: Path, settings: dict[str, Any], fresh: bool) -> None:
        self.path = workdir / STATE_FILE
        if fresh and workdir.exists():
            wipe(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            try:
                self.data = json.loads(self.path.read_text())
            except ValueError as exc:
                raise SystemExit(f"{self.path} is damaged ({exc}); use --fresh to start over "
                                 "or another workdir") from None
            # compared as dotted paths, so a refusal names ``train.lora_r``, not ``train``
            old = {k: v for k, v in paths_values(self.data["settings"]).items()
                   if k not in BUDGET}
            new = {k: v for k, v in paths_values(settings).items() if k not in BUDGET}
            if old != new:
                changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                raise SystemExit(f"{self.path} was made with other settings ({', '.join(changed)}"
                                 "); use --fresh to start over or another workdir")
            self.data["settings"].update({k: settings[k] for k in BUDGET if k in settings})
            self.data["resumed"] = self.data.get("resumed", 0) + 1
        else:
            self.data = {"settings": settings, "rounds": [], "seconds": {}, "resumed": 0}
        self.save()

    def save(self) -> None:
        replace_text(self.path, json.dumps(self.data, indent=2))

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            secs = self.data["seconds"]
            secs[stage] = secs.get(stage, 0.0) + time.perf_counter() - t0
            self.save()

    @property
    def elapsed(self) -> float:
        return float(sum(self.data["seconds"].values()))
