"""LLM judges over span directories: ``judge_spans`` (and ``agl-bridge judge``).

The IO around the pure judge (``agl_bridge.trainer.rewards.judge``): ``spans`` reads the
episodes as text, ``client`` calls the judge model over plain HTTP (never traced, so never
training data), ``cache`` remembers verdicts, ``run`` puts them together and writes the scores
as evaluation records that conversion joins to their episodes. See docs/judges.md.

Kept out of ``trainer/rewards/``, which holds pure functions only (no files, no network).
"""

from typing import TYPE_CHECKING, Any

from agl_bridge.trainer.judging.config import JudgeConfig

if TYPE_CHECKING:
    from agl_bridge.trainer.judging.run import JudgeSummary, judge_spans, load_rubric


def __getattr__(name: str) -> Any:
    """``run`` loads when first used: the CLI reads ``JudgeConfig`` without pyarrow."""
    if name in ("JudgeSummary", "judge_spans", "load_rubric"):
        from agl_bridge.trainer.judging import run

        return getattr(run, name)
    raise AttributeError(name)


__all__ = ["JudgeConfig", "JudgeSummary", "judge_spans", "load_rubric"]
