"""Beam search over prompt candidates, as Agent Lightning's APO does it: each round, every
prompt of the beam is critiqued from its episodes and rewritten ``branch_factor`` ways; all
are scored on held-out tasks and the best ``beam_width`` (the beam's own included) go on.

Pure of IO: what scores a prompt, writes a critique and rewrites are passed in, so the search
is tested with scripted ones and run with the team command and the optimizer model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agl_bridge.trainer.loop.apo.transcripts import Transcript
from agl_bridge.trainer.loop.gate import Scores


@dataclass
class Candidate:
    """One prompt the search tried: where it came from and how it scored."""

    id: str  # "root", "r1c3": round 1, the third rewrite of that round
    text: str
    round: int
    parent: str | None = None
    critique: str | None = None
    scores: Scores | None = None
    episodes: list[Transcript] = field(default_factory=list, repr=False)

    @property
    def mean(self) -> float:
        """Mean team score over the held-out tasks (NaN before it is scored)."""
        team = self.scores.team if self.scores else {}
        return math.fsum(team.values()) / len(team) if team else math.nan

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "round": self.round, "parent": self.parent, "text": self.text,
                "critique": self.critique, "mean": None if math.isnan(self.mean) else self.mean,
                "tasks": len(self.scores.team) if self.scores else 0,
                "scores": self.scores.as_dict() if self.scores else None}


Evaluate = Callable[[Candidate], "tuple[Scores, list[Transcript]]"]
Critique = Callable[[Candidate], str]
Rewrite = Callable[[Candidate, str], "str | None"]


def _rank(c: Candidate) -> tuple[float, int]:
    """Higher mean first; on a tie the older candidate (fewer rewrites away from the root)."""
    return (-c.mean if not math.isnan(c.mean) else math.inf, c.round)


def beam_search(root: Candidate, *, evaluate: Evaluate, critique: Critique, rewrite: Rewrite,
                beam_width: int, branch_factor: int, rounds: int,
                log: Callable[[str], None] = lambda _: None) -> list[Candidate]:
    """Every candidate tried, the root first (scored once, before the first round)."""
    root.scores, episodes = evaluate(root)
    root.episodes = root.episodes or episodes
    log(f"{root.id}: {root.mean:.3f}")
    tried = [root]
    seen = {root.text.strip()}
    beam = [root]
    for r in range(1, rounds + 1):
        new: list[Candidate] = []
        for parent in beam:
            text_of_critique = critique(parent)
            for _ in range(branch_factor):
                text = rewrite(parent, text_of_critique)
                if text is None or text.strip() in seen:
                    continue  # nothing new: not scored again
                seen.add(text.strip())
                new.append(Candidate(f"r{r}c{len(new) + 1}", text, r, parent.id,
                                     text_of_critique))
        for c in new:
            c.scores, c.episodes = evaluate(c)
            log(f"{c.id} (from {c.parent}): {c.mean:.3f}")
        tried += new
        beam = sorted(beam + new, key=_rank)[:beam_width]
        log(f"round {r}: beam {', '.join(f'{c.id} {c.mean:.3f}' for c in beam)}")
    return tried


def best(tried: Sequence[Candidate]) -> Candidate:
    """The best-scored candidate (the root if nothing beat it)."""
    return sorted(tried, key=_rank)[0]
