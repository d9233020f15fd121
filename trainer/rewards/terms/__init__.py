"""The terms a reward recipe can name, one module per family (``recipes.TERMS`` maps TOML
names to them):

* ``tools``: ``tool_failure``, a failed tool call costs the calling agent;
* ``votes``: a voter rewarded for voting for the selected or the best rated answer;
* ``coordination``: the team's coordination (answer quality, consensus, rounds, tokens);
* ``dag``: DAG workflow tasks (success, retries, downstream successes) and completion;
* ``workflow``: ``workflow`` (the planner's, Flow scheme 1: success rate, efficiency,
  complexity) and ``global`` (the team's, scheme 5: success rate, efficiency, failures);
* ``delegation``: the planner assigned each task to an executor or tool that can do it;
* ``tool_choice``: an executor called the right tool for its task, and calls that failed;
* ``cost``: tokens and latency of each LLM call, charged to the agent that made it.

Shared parts: ``base`` (the term contract, its output, config checks), ``spans`` (reading
rows and attributes), ``ballots`` (votes, restarts and selections of an episode), ``ratings``
(quality and ratings from the rewards and evaluations an episode has). docs/recipes.md
describes each term with a worked example.
"""

from agl_bridge.trainer.rewards.terms.coordination import Coordination
from agl_bridge.trainer.rewards.terms.cost import Cost
from agl_bridge.trainer.rewards.terms.dag import Dag
from agl_bridge.trainer.rewards.terms.delegation import Delegation
from agl_bridge.trainer.rewards.terms.tool_choice import ToolChoice
from agl_bridge.trainer.rewards.terms.tools import ToolFailure
from agl_bridge.trainer.rewards.terms.votes import Votes
from agl_bridge.trainer.rewards.terms.workflow import GlobalReward, WorkflowReward

__all__ = ["Coordination", "Cost", "Dag", "Delegation", "GlobalReward", "ToolChoice",
           "ToolFailure", "Votes", "WorkflowReward"]
