"""The terms a reward recipe can name, one module per family (``recipes.TERMS`` maps TOML
names to them):

* ``tools``: ``tool_failure``, a failed tool call costs the calling agent.

Shared parts: ``base`` (the term contract, its output, config checks), ``spans`` (reading
rows and attributes).
"""

from agl_bridge.trainer.rewards.terms.tools import ToolFailure

__all__ = ["ToolFailure"]
