"""LLM judges over span directories: ``judge_spans`` (and ``agl-bridge judge``).

The IO around the pure judge (``agl_bridge.trainer.rewards.judge``): ``spans`` reads the
episodes as text, ``client`` calls the judge model over plain HTTP (never traced, so never
training data), ``cache`` remembers verdicts, ``run`` puts them together and writes the scores
as evaluation records that conversion joins to their episodes. See docs/judges.md.

Kept out of ``trainer/rewards/``, which holds pure functions only (no files, no network).
"""

from agl_bridge.trainer.judging.run import JudgeSummary, judge_spans, load_rubric

__all__ = ["JudgeSummary", "judge_spans", "load_rubric"]
