"""Verdicts already given, so a second run over the same spans asks the judge nothing.

One JSON line per judged unit (an episode in absolute mode, a group in relative mode) in
``<spans>/_judge/cache.jsonl``, keyed by ``rewards.judge.cache_key`` (prompt version, mode,
judge model, rubric digest, and each episode's id and text digest). Append-only and fsynced
after each line, written only after the unit's scores are durable in the span store: a crash
between the two costs one repeated request, never a lost score. The file lives beside the
spans it describes, so it travels and is deleted with them.

A line that is not a cache entry (cut short by a crash, edited by hand) is reported with its
line number and ignored: that unit is judged again.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

CACHE_DIR = "_judge"
CACHE_FILE = "cache.jsonl"


class JudgeCache:
    def __init__(self, spans_dir: str | os.PathLike[str]) -> None:
        self.path = Path(spans_dir) / CACHE_DIR / CACHE_FILE
        self.entries: dict[str, dict[str, Any]] = {}
        self.problems: list[str] = []
        self._lock = threading.Lock()
        self._newline_first = False
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        self._newline_first = bool(raw) and not raw.endswith(b"\n")
        for number, line in enumerate(raw.split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict) or not isinstance(entry.get("key"), str) \
                        or not isinstance(entry.get("scores"), dict) or not all(
                            isinstance(s, dict) and isinstance(s.get("score"), (int, float))
                            for s in entry["scores"].values()):
                    raise ValueError("not a cache entry")
            except ValueError as exc:
                self.problems.append(f"{self.path}:{number}: corrupt cache line ignored "
                                     f"({exc}): {line[:80].decode(errors='replace')!r}")
                continue
            self.entries[entry["key"]] = entry

    def get(self, key: str) -> dict[str, Any] | None:
        return self.entries.get(key)

    def put(self, entry: dict[str, Any]) -> None:
        """Append one entry (with its ``key``) durably."""
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # owner-only, like the span files it sits beside
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                if self._newline_first:  # a line cut short by a crash: do not extend it
                    f.write("\n")
                    self._newline_first = False
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self.entries[entry["key"]] = entry
