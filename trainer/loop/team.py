"""The team command: the user's own agent program, run by the loop, configured by environment.

The loop (``agl-bridge loop``), replay (``agl-bridge replay``) and the demo run a team the same
way: as its own process, the program unchanged, capture switched on from outside. What the
program reads (all optional but the tasks):

==========================  =====================================================================
``AGL_BRIDGE_TASKS``        JSON lines, one task each: ``task_id`` and whatever else the program
                            needs (``messages`` when replayed from stored episodes)
``AGL_BRIDGE_ROLLOUTS``     episodes per task (a group for group-relative training)
``AGL_BRIDGE_TEMPERATURE``  sampling temperature (0: greedy, as for held-out evaluation)
``AGL_BRIDGE_RESULTS``      where to write one JSON line per episode: ``task_id``, and ``score``
                            (what evaluation compares) and ``episode_id`` when the program knows;
                            ``agent_score`` (agent -> score) lets the gate judge each role too
``OPENAI_BASE_URL``         the serving vLLM (the openai SDK reads it itself)
``OPENAI_API_KEY``          set to a placeholder when unset (vLLM needs none)
==========================  =====================================================================

and, for capture: ``AGL_BRIDGE_AUTO=1``, ``AGL_BRIDGE_PARQUET_DIR`` (where its spans go),
``AGL_BRIDGE_ALIASES`` (the alias table: the agents' model names resolve to the live adapter
versions, or to a candidate's during a gate evaluation), ``OTEL_SERVICE_NAME``.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASKS_ENV = "AGL_BRIDGE_TASKS"
ROLLOUTS_ENV = "AGL_BRIDGE_ROLLOUTS"
TEMPERATURE_ENV = "AGL_BRIDGE_TEMPERATURE"
RESULTS_ENV = "AGL_BRIDGE_RESULTS"


class TeamError(RuntimeError):
    """The team command failed; the message has its exit status and the end of its stderr."""


@dataclass(frozen=True)
class TeamRun:
    """What one run of the team produced."""

    spans: Path
    results: list[dict[str, Any]]  # the program's per-episode lines (may be empty)
    summary: dict[str, Any]  # the last stdout line, when it is a JSON object
    seconds: float


def command_argv(command: str | Sequence[str]) -> list[str]:
    """A team command as argv: a list as it is, a string split as a shell would (no shell
    runs it); a leading ``python`` is this interpreter, so the venv's packages are there."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv:
        raise ValueError("the team command is empty")
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def read_tasks(path: str | Path) -> list[dict[str, Any]]:
    """Tasks as JSON lines (``write_tasks``'); a line that is not an object with a string
    ``task_id`` is an error naming it."""
    tasks = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc})") from None
        if not isinstance(task, dict) or not isinstance(task.get("task_id"), str):
            raise ValueError(f"{path}:{n}: a task needs a string task_id")
        tasks.append(task)
    return tasks


def write_tasks(path: Path, tasks: Iterable[Mapping[str, Any]]) -> int:
    """Tasks as JSON lines; each must have a string ``task_id``."""
    n = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for t in tasks:
            if not isinstance(t.get("task_id"), str) or not t["task_id"]:
                raise ValueError(f"task {n}: needs a non-empty string task_id, got {t!r}"[:300])
            f.write(json.dumps(t) + "\n")
            n += 1
    return n


def run_team(command: str | Sequence[str], tasks: Iterable[Mapping[str, Any]], out_dir: Path, *,
             base_url: str, aliases: Path | None, rollouts: int = 1, temperature: float = 0.0,
             service: str = "team", timeout_s: float | None = None,
             extra_env: Mapping[str, str] | None = None) -> TeamRun:
    """Run the team on ``tasks``: spans to ``out_dir/spans``, its results to
    ``out_dir/results.jsonl``. Its stderr goes to the terminal (progress, errors)."""
    import time

    out_dir.mkdir(parents=True, exist_ok=True)
    task_file = out_dir / "tasks.jsonl"
    write_tasks(task_file, tasks)
    results = out_dir / "results.jsonl"
    results.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update({
        "AGL_BRIDGE_AUTO": "1", "AGL_BRIDGE_PARQUET_DIR": str(out_dir / "spans"),
        "OTEL_SERVICE_NAME": service, "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": env.get("OPENAI_API_KEY") or "unused",
        TASKS_ENV: str(task_file), ROLLOUTS_ENV: str(rollouts),
        TEMPERATURE_ENV: repr(float(temperature)), RESULTS_ENV: str(results),
        "PYTHONWARNINGS": "ignore"})
    if aliases is not None:
        env["AGL_BRIDGE_ALIASES"] = str(aliases)
    env.update(extra_env or {})
    t0 = time.perf_counter()
    proc = subprocess.run(command_argv(command), env=env, stdout=subprocess.PIPE,
                          stderr=None, text=True, cwd=out_dir, timeout=timeout_s)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise TeamError(f"the team command failed (exit {proc.returncode}); its errors are "
                        "above")
    summary: dict[str, Any] = {}
    lines = proc.stdout.strip().splitlines()
    if lines:
        try:
            last = json.loads(lines[-1])
            summary = last if isinstance(last, dict) else {}
        except ValueError:
            pass
    return TeamRun(out_dir / "spans", read_results(results), summary, seconds)


def read_results(path: Path) -> list[dict[str, Any]]:
    """The program's per-episode lines; a malformed line is skipped (named on stderr)."""
    if not path.exists():
        return []
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            print(f"{path}:{n}: not JSON (skipped)", file=sys.stderr)
            continue
        if isinstance(row, dict):
            out.append(row)
    return out


def task_scores(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Mean ``score`` per task (``success`` as 0/1, else ``team_reward``, when no score)."""
    sums: dict[str, list[float]] = {}
    for r in results:
        value = r.get("score")
        if value is None and "success" in r:
            value = float(bool(r["success"]))
        if value is None:
            value = r.get("team_reward")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                isinstance(r.get("task_id"), str):
            sums.setdefault(r["task_id"], []).append(float(value))
    return {t: sum(v) / len(v) for t, v in sums.items()}


ROLE_KEYS = ("agent_score", "agent_correct", "agent_reward")  # the first a line has is used


def role_scores(results: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Agent -> task -> mean of the agent's own score: ``agent_score``, else ``agent_correct``
    as 0/1, else ``agent_reward`` (each an object keyed by agent), as the program wrote it."""
    sums: dict[str, dict[str, list[float]]] = {}
    for r in results:
        own = next((r[k] for k in ROLE_KEYS if isinstance(r.get(k), dict)), None)
        if own is None or not isinstance(r.get("task_id"), str):
            continue
        for agent, value in own.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                sums.setdefault(str(agent), {}).setdefault(r["task_id"], []).append(
                    float(value))
    return {a: {t: sum(v) / len(v) for t, v in tasks.items()} for a, tasks in sums.items()}
