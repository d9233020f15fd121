"""``tool_choice``: an executor is rewarded for calling the right tool for its task, and pays
for calls that fail::

    per tool call = (right if the tool can do what the task requires else wrong)
                  + (failure if the call ended in error)

Tool calls are ``execute_tool`` spans (``gen_ai.operation.name``, ``gen_ai.tool.name``); a call
made inside a workflow task carries the task's id, and the task's requirement comes from its
latest schedule span (``agl_bridge.workflow.task.requires``; the capabilities recorded there
say what each tool can do, else a tool can do what it is called: see ``delegation``). A call
outside any task, or in a task with no requirement, is judged by its failure only (noted).
Scope: the calling agent's turn, else the agent, else the episode (``local_reward``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge import semconv as sc
from agl_bridge.trainer.rewards.terms.base import (
    EPISODE_KEY,
    NO_EVALUATIONS,
    Derived,
    Evaluations,
    TableTerm,
    local_reward,
)
from agl_bridge.trainer.rewards.terms.delegation import read_schedules
from agl_bridge.trainer.rewards.terms.spans import attributes

NO_REQUIREMENT = "tool call outside a task with a requirement (judged on failure only)"
NO_TOOL_NAME = "tool call without gen_ai.tool.name (judged on failure only)"


@dataclass(frozen=True)
class ToolChoice(TableTerm):
    right: float = 0.5
    wrong: float = -0.5
    failure: float = -0.25
    weight: float = 1.0
    name: str = "tool_choice"
    columns: tuple[str, ...] = ("name", "attributes", "span_id", "start_time_unix_nano",
                                "operation_name", "status_code", "agent_name", "turn_index")

    def __call__(self, spans: pa.Table, evaluations: Evaluations = NO_EVALUATIONS) -> Derived:
        out = Derived()
        calls = spans.select([EPISODE_KEY, "attributes", "status_code", "agent_name",
                              "turn_index"]).filter(pc.fill_null(pc.equal(
                                  spans["operation_name"], sc.OP_EXECUTE_TOOL), False))
        if calls.num_rows == 0:
            return out
        schedules = read_schedules(spans, out, self.name)
        keys = [sc.GEN_AI_TOOL_NAME, sc.WORKFLOW_ID, sc.WORKFLOW_TASK_ID]
        for row, attrs in zip(calls.select([EPISODE_KEY, "status_code", "agent_name",
                                            "turn_index"]).to_pylist(),
                              attributes(calls, keys)):
            value = self.failure if row["status_code"] == "ERROR" else 0.0
            tool, wf, task_id = (attrs.get(k) for k in keys)
            schedule = schedules.get((row[EPISODE_KEY], wf if isinstance(wf, str) else None,
                                      task_id)) if isinstance(task_id, str) else None
            if schedule is None or schedule.requires is None:
                out.note(self.name, NO_REQUIREMENT)
            elif not isinstance(tool, str) or not tool:
                out.note(self.name, NO_TOOL_NAME)
            else:
                value += self.right if schedule.can(tool, schedule.requires) else self.wrong
            if value != 0.0:
                out.rewards.append(local_reward(row[EPISODE_KEY], self.weight * value,
                                                row["agent_name"], row["turn_index"], self.name))
        return out
