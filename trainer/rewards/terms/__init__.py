"""The terms a reward recipe can name, one module per family (``recipes.TERMS`` maps TOML
names to them):

* ``tools``: ``tool_failure``, a failed tool call costs the calling agent;
* ``votes``: a voter rewarded for voting for the selected or the best rated answer;
* ``coordination``: the team's coordination (answer quality, consensus, rounds, tokens).

Shared parts: ``base`` (the term contract, its output, config checks), ``spans`` (reading
rows and attributes), ``ballots`` (votes, restarts and selections of an episode), ``ratings``
(quality and ratings from the rewards and evaluations an episode has).
"""

from agl_bridge.trainer.rewards.terms.coordination import Coordination
from agl_bridge.trainer.rewards.terms.tools import ToolFailure
from agl_bridge.trainer.rewards.terms.votes import Votes

__all__ = ["Coordination", "ToolFailure", "Votes"]
