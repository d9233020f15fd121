"""``coordination``: how well the team coordinated, once per episode, to the whole team (the
MassGen design's ``compute_coordination_reward``)::

    reward = quality_weight x quality
           + (consensus if the final selection had consensus else no_consensus)
           + per_round x max(0, rounds - free_rounds)
           + per_token x tokens

* ``quality``: the final answer's quality, from ``quality`` (``ratings.py``: ``"task"``, the
  episode's own team reward, or ``"evaluation:NAME"``, e.g. a judge's); 0 when the source has
  nothing for the episode (the design's placeholder), noted.
* consensus (``consensus_rule``): ``"majority"``: the selected agent got more than half of the
  votes; ``"unanimous"``: every vote went to it (and there was one). Votes are the final
  selection's own tallies when it recorded them, else the votes that count (``ballots.py``).
  No final selection: no consensus.
* ``rounds``: the highest 0-based coordination round on any of the episode's spans, + 1.
  MassGen counts an agent's rounds up when a new answer restarts it, so restarts cost here,
  through the rounds they add; restart spans are not counted a second time.
* ``tokens``: the sum over the episode's LLM calls of ``gen_ai.usage`` input and output tokens
  (``tokens``: ``"input+output"``, ``"input"`` or ``"output"``), a call's token id lists where
  it has no usage attribute.

Only episodes with coordination spans (votes, answers, restarts, rounds, a final selection)
get this reward: a recipe can run over a mix of voting and other workflows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge.trainer.rewards.terms import ballots as bl
from agl_bridge.trainer.rewards.terms.base import (
    EPISODE_KEY,
    NO_EVALUATIONS,
    Derived,
    Evaluations,
    Readers,
    TableTerm,
    team_reward,
)
from agl_bridge.trainer.rewards.terms.ratings import (
    REWARD_COLUMNS,
    TASK,
    Source,
    episode_quality,
    source,
)
from agl_bridge.trainer.rewards.terms.spans import TOKENS, call_tokens, is_chat

RULES = ("majority", "unanimous")
NO_QUALITY = "episode without a quality from its source (quality 0)"
NO_SELECTION = "episode without a final selection (no consensus)"


@dataclass(frozen=True)
class Coordination(TableTerm):
    quality: Source = TASK
    quality_weight: float = 2.0
    consensus: float = 1.0
    no_consensus: float = -0.5
    consensus_rule: str = "majority"
    free_rounds: int = 3
    per_round: float = -0.1
    per_token: float = -0.001
    tokens: str = "input+output"
    weight: float = 1.0
    name: str = "coordination"
    columns: tuple[str, ...] = (*bl.COLUMNS, "operation_name", "prompt_token_ids",
                                "completion_token_ids", *REWARD_COLUMNS)
    readers: ClassVar[Readers] = {"quality": source, "consensus_rule": RULES, "tokens": TOKENS}

    def __call__(self, spans: pa.Table, evaluations: Evaluations = NO_EVALUATIONS) -> Derived:
        out = Derived()
        ballots = bl.read_ballots(spans)
        if not ballots:
            return out
        selected = {e: (b.selected.agent if b.selected else None) for e, b in ballots.items()}
        quality = episode_quality(spans, evaluations, self.quality, selected)
        tokens = self._tokens(spans, set(ballots))
        for episode, b in ballots.items():
            for why, n in b.notes.items():
                out.note(self.name, why, n)
            if episode not in quality:
                out.note(self.name, NO_QUALITY)
            if b.selected is None:
                out.note(self.name, NO_SELECTION)
            value = (self.quality_weight * quality.get(episode, 0.0)
                     + (self.consensus if self.agreed(b) else self.no_consensus)
                     + self.per_round * max(0, b.rounds - self.free_rounds)
                     + self.per_token * tokens.get(episode, 0))
            out.rewards.append(team_reward(episode, self.weight * value, self.name))
        return out

    def agreed(self, b: bl.Ballot) -> bool:
        """Whether the final selection had consensus, by ``consensus_rule``."""
        if b.selected is None:
            return False
        tally = b.tally()
        total, won = sum(tally.values()), tally.get(b.selected.agent, 0)
        if self.consensus_rule == "unanimous":
            return total > 0 and won == total
        return 2 * won > total

    def _tokens(self, spans: pa.Table, episodes: set[str]) -> dict[str, int]:
        mask = pc.and_(is_chat(spans), pc.is_in(spans[EPISODE_KEY], value_set=pa.array(
            list(episodes), pa.string())))
        out: dict[str, int] = {}
        for episode, n in zip(spans[EPISODE_KEY].filter(mask).to_pylist(),
                              call_tokens(spans, self.tokens, mask).tolist()):
            out[episode] = out.get(episode, 0) + n
        return out

