"""The terms a reward recipe can name, one module per family (``recipes.TERMS`` maps TOML
names to them):

* ``tools``: ``tool_failure``, a failed tool call costs the calling agent;
* ``votes``: a voter rewarded for voting for the selected or the best rated answer;
* ``coordination``: the team's coordination (answer quality, consensus, rounds, tokens);
* ``dag``: DAG workflow tasks (success, retries, downstream successes) and completion;
* ``cost``: tokens and latency of each LLM call, charged to the agent that made it.

Shared parts: ``base`` (the term contract, its output, config checks), ``spans`` (reading
rows and attributes), ``ballots`` (votes, restarts and selections of an episode), ``ratings``
(quality and ratings from the rewards and evaluations an episode has). docs/recipes.md
describes each term with a worked example.
"""

from agl_bridge.trainer.rewards.terms.coordination import Coordination
from agl_bridge.trainer.rewards.terms.cost import Cost
from agl_bridge.trainer.rewards.terms.dag import Dag
from agl_bridge.trainer.rewards.terms.tools import ToolFailure
from agl_bridge.trainer.rewards.terms.votes import Votes

__all__ = ["Coordination", "Cost", "Dag", "ToolFailure", "Votes"]
