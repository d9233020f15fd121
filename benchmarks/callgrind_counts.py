"""Instruction counts of a block of Python under callgrind, shared by the benchmarks whose
figures a shared 2-core machine's load would otherwise move (no hardware counters in this
container; instruction counts repeat).

A worker process calls ``Counter.start()`` and ``Counter.stop()`` around what is counted: a
client request zeroes the counters and switches counting on, another dumps them under
``LABEL`` and switches counting off (a tiny C helper built here against
``valgrind/callgrind.h``). The driver runs the worker with ``run_counted`` under
``valgrind --tool=callgrind --instr-atstart=no`` and sums the dumps so labelled; the dump at
exit, with nothing counted after the stop, is left out.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import signal
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABEL = "counted"
HELPER_C = rf"""
#include <valgrind/callgrind.h>
void agl_start(void) {{ CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }}
void agl_stop(void) {{ CALLGRIND_DUMP_STATS_AT("{LABEL}"); CALLGRIND_STOP_INSTRUMENTATION; }}
"""


def _library() -> Path:
    """Built once per source: the name carries its hash, so an older helper (another label)
    left in ``.cache`` is never loaded by mistake."""
    digest = hashlib.sha256(HELPER_C.encode()).hexdigest()[:12]
    out = ROOT / ".cache" / f"callgrind_helper-{digest}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        src = out.with_suffix(".c")
        src.write_text(HELPER_C)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


class Counter:
    """In the worker: ``start()`` before the counted block, ``stop()`` after it.

    Also gives SIGINT a handler of its own: ``asyncio.run`` installs one per run while the
    default is in place, and on restoring the default the signal module reprs the handler it
    replaced (an enum lookup that fails), so the finished task and its result: work that varied
    between processes by hundreds of thousands of instructions a step, no cost of what is
    measured."""

    def __init__(self) -> None:
        self._lib = ctypes.CDLL(str(_library()))
        signal.signal(signal.SIGINT, _interrupt)

    def start(self) -> None:
        self._lib.agl_start()

    def stop(self) -> None:
        self._lib.agl_stop()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_counted(cmd: list[str], env: dict[str, str], cwd: Path = ROOT
                ) -> tuple[subprocess.CompletedProcess[str], int, list[str]]:
    """Run ``cmd`` (a worker that uses ``Counter``) under callgrind: (the finished process,
    the instructions counted between its ``start`` and ``stop`` calls, the text of each dump
    counted, for ``callgrind_annotate``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        done = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                               f"--callgrind-out-file={out}.%p", *cmd],
                              capture_output=True, text=True, env=env, cwd=cwd)
        total, texts = 0, []
        for f in sorted(Path(tmp).iterdir()):
            text = f.read_text(errors="replace")
            if f"Client Request: {LABEL}" not in text[:2000]:
                continue
            m = re.search(r"^summary:\s+(\d+)", text, re.M) or re.search(
                r"^totals:\s+(\d+)", text, re.M)
            if m:
                total += int(m.group(1))
                texts.append(text)
    return done, total, texts
