"""``tool_failure``: a tool call that failed costs the agent that made it."""

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


@dataclass(frozen=True)
class ToolFailure(TableTerm):
    """An ``execute_tool`` span that ended in error: ``penalty`` to the agent that called the
    tool (its turn when the span has one); a successful one: ``success`` (default 0)."""

    penalty: float = -0.2
    success: float = 0.0
    weight: float = 1.0
    name: str = "tool_failure"
    columns: tuple[str, ...] = ("operation_name", "status_code", "agent_name", "turn_index")

    def __call__(self, spans: pa.Table, evaluations: Evaluations = NO_EVALUATIONS) -> Derived:
        tools = spans.select([EPISODE_KEY, "status_code", "agent_name", "turn_index"]).filter(
            pc.fill_null(pc.equal(spans["operation_name"], sc.OP_EXECUTE_TOOL), False))
        out = Derived()
        for row in tools.to_pylist():
            value = self.penalty if row["status_code"] == "ERROR" else self.success
            if value != 0.0:
                out.rewards.append(local_reward(row[EPISODE_KEY], self.weight * value,
                                                row["agent_name"], row["turn_index"], self.name))
        return out
