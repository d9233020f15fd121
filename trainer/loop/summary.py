"""The loop's summary on the terminal and in ``summary.txt``: held-out before and after, each
round's outcome (published, refused by the gate, rolled back), how the episodes each prompt
version served did, and where the time went."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from agl_bridge.trainer.loop.report import prompt_version_lines


def _score(evaluation: dict[str, Any] | None) -> str:
    if not evaluation or "score" not in evaluation:
        return "not evaluated"
    score = evaluation["score"]
    return f"{score:.3f} on {evaluation.get('n', 0)} tasks" if not math.isnan(score) else "n/a"


def summary_text(data: dict[str, Any]) -> str:
    lines = ["", f"held-out score: before {_score(data.get('baseline'))}, after "
                 f"{_score(data.get('final'))}"]
    for r in data["rounds"]:
        gate = r.get("gate") or {}
        if r.get("published"):
            outcome = "published " + ", ".join(r["published"].values())
        elif not r.get("trained", True):
            outcome = "nothing to train on"
        else:
            outcome = f"refused: {gate.get('rule', '')}"
        if r.get("lever") == "apo":  # a prompt round (algorithm apo): candidates, not training
            tried = sum(max(a.get("candidates", 1) - 1, 0) for a in r.get("apo", {}).values())
            if not (r.get("published") or gate or r.get("held")):
                outcome = "no candidate beat the live prompts on the round's tasks"
            line = f"  round {r['round']}: APO, {tried} prompt candidate(s); {outcome}"
        else:
            line = f"  round {r['round']}: {r.get('transitions') or 0} transitions; {outcome}"
        if r.get("rolled_back"):
            line += f"; rolled back: {r['watch']['reason']}"
        if r.get("prompt_rolled_back"):
            line += f"; prompts rolled back: {r['prompt_watch']['reason']}"
        lines.append(line)
    lines += prompt_version_lines(data)
    secs = data["seconds"]
    lines.append("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in secs.items())
                 + f"; total {sum(secs.values()) / 60:.1f} min")
    return "\n".join(lines)


def write_summary(work: Path, data: dict[str, Any]) -> str:
    text = summary_text(data)
    (work / "summary.txt").write_text(text)
    return text
