"""Spans -> transitions: one transition per agent per turn, with rewards, groups, advantages.

The converter decides what the trainer learns from, so it is explicit about every choice:

* **Transitions.** LLM spans (``gen_ai.operation.name = chat``) with token ids. An agent's calls
  within one turn (same episode, agent, turn and candidate) are merged into one transition when
  each next prompt extends the context so far (previous prompt + completion): the tokens the
  next prompt adds (tool results, other agents' messages) join the completion with mask 0, so
  they are context, not trained on. A call that does not extend the context starts a new
  transition, and is counted.
* **Turns** (``turns.py``): from the turn attribute, else the coordination round, else the
  order of the calls.
* **Rewards** (``reward_spans.py``) are matched within their episode only, by scope; credit and
  advantages are ``agl_bridge.trainer.rewards``.
* **Bad input never stops the batch**: skips and notes are counted (``reasons.py`` spells
  them); unreadable files are named and skipped.

Modules: ``config`` (ConvertConfig, ConversionStats), ``reasons``, ``columns`` (what is
read; Arrow/numpy helpers are ``agl_bridge.trainer.arrow``), ``stages`` (the one
implementation, table in, table out), ``turns``, ``reward_spans``, ``retokenize`` (ids
rebuilt from messages, before the stages), ``sources`` (files), ``streaming``, ``spill`` and
``memory`` (large inputs), ``engine`` (``convert``: the route an input needs). No torch
anywhere here.
"""

from typing import TYPE_CHECKING, Any

from agl_bridge.trainer.conversion.config import ConversionStats, ConvertConfig

if TYPE_CHECKING:
    from agl_bridge.trainer.conversion.engine import convert, spans_to_transitions
    from agl_bridge.trainer.conversion.sources import read_spans


def __getattr__(name: str) -> Any:
    """The engine (pyarrow) loads when first used: the CLI reads ``ConvertConfig`` without it."""
    if name in ("convert", "spans_to_transitions"):
        from agl_bridge.trainer.conversion import engine

        return getattr(engine, name)
    if name == "read_spans":
        from agl_bridge.trainer.conversion.sources import read_spans

        return read_spans
    raise AttributeError(name)


__all__ = ["ConversionStats", "ConvertConfig", "convert", "read_spans", "spans_to_transitions"]
