"""An AutoGen SelectorGroupChat team, written the way AutoGen's own guide writes one: a planner
that splits the task, a web searcher and a data analyst with one function tool each, and an LLM
that picks who speaks next. One model client serves all three agents and the selector.

No agl-bridge code: docs/own-team.md captures it, trains an adapter per agent and routes each
agent to its own, all from the environment.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python examples/autogen_selector_team.py ["task" ...]

Environment: ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` (any value for a local vLLM), ``MODEL``
(the served model name, default ``base``), ``LLM_CALL_LOG`` (where each model call is logged as
one JSON line with its response id, default ``llm_calls.jsonl``). Tasks come from the command
line, or the small list below.
"""

import asyncio
import logging
import os
import sys

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.teams import SelectorGroupChat
from autogen_agentchat.ui import Console
from autogen_core import EVENT_LOGGER_NAME
from autogen_core.logging import LLMCallEvent
from autogen_ext.models.openai import OpenAIChatCompletionClient

TASKS = [
    "Which Miami Heat player scored the most points in the 2006-2007 season, and by what "
    "percentage did his total rebounds change between the 2007-2008 and 2008-2009 seasons?",
    "How much did the Heat's season wins change, in percent, from 2005-2006 to 2006-2007?",
]

# A stand-in for a search API: the same few facts whatever the wording of the query.
FACTS = {
    "2006-2007": "Miami Heat 2006-2007 points: Dwyane Wade 1397, Udonis Haslem 844, "
                 "James Posey 550, Shaquille O'Neal 694.",
    "2007-2008": "Dwyane Wade 2007-2008 total rebounds: 214.",
    "2008-2009": "Dwyane Wade 2008-2009 total rebounds: 398.",
    "wins": "Miami Heat wins: 52 in 2005-2006, 44 in 2006-2007.",
}


def search_web_tool(query: str) -> str:
    """Search the web for sports statistics."""
    found = [fact for key, fact in FACTS.items() if key in query]
    return " ".join(found) or "No results found."


def percentage_change_tool(start: float, end: float) -> float:
    """The percentage change from start to end."""
    return ((end - start) / start) * 100


class CallLog(logging.Handler):
    """One JSON line per model call (AutoGen's own LLMCallEvent): the agent that made it and
    the server's response id, which a reviewer's score can name later."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, LLMCallEvent):
            with open(self.path, "a") as f:
                f.write(str(record.msg) + "\n")


def build_team() -> SelectorGroupChat:
    model_client = OpenAIChatCompletionClient(
        model=os.environ.get("MODEL", "base"),
        # a self-served model is not one AutoGen knows: say what it can do
        model_info={"vision": False, "function_calling": True, "json_output": False,
                    "family": "unknown", "structured_output": False},
    )
    planning_agent = AssistantAgent(
        "PlanningAgent",
        description="Plans the work; the first to speak on a new task.",
        model_client=model_client,
        system_message=(
            "You are a planning agent. Break the task into small steps and give each to a team "
            "member: WebSearchAgent searches for facts, DataAnalystAgent computes. You only "
            "plan and delegate; you do not do the steps yourself. Write each assignment as "
            "'1. <agent> : <step>'. When every step is done, summarise the answer and end "
            "with TERMINATE."),
    )
    web_search_agent = AssistantAgent(
        "WebSearchAgent",
        description="Finds facts on the web.",
        tools=[search_web_tool],
        model_client=model_client,
        system_message=(
            "You are a web search agent. Your only tool is search_web_tool: use it to find "
            "what you are asked for, one search at a time. Do not compute anything."),
    )
    data_analyst_agent = AssistantAgent(
        "DataAnalystAgent",
        description="Computes with the facts the others found.",
        tools=[percentage_change_tool],
        model_client=model_client,
        system_message=(
            "You are a data analyst. Compute what the plan asks with your tools and state the "
            "result. If a number is missing, ask for it."),
    )
    selector_prompt = """Select an agent to do the next step.

{roles}

The conversation so far:
{history}

Read the conversation, then select the next speaker from {participants}.
The planner must assign the work before the others start. Select exactly one agent.
"""
    termination = TextMentionTermination("TERMINATE") | MaxMessageTermination(max_messages=12)
    return SelectorGroupChat(
        [planning_agent, web_search_agent, data_analyst_agent],
        model_client=model_client,
        termination_condition=termination,
        selector_prompt=selector_prompt,
        allow_repeated_speaker=True,
    )


async def main(tasks: list[str]) -> None:
    events = logging.getLogger(EVENT_LOGGER_NAME)
    events.setLevel(logging.INFO)
    events.addHandler(CallLog(os.environ.get("LLM_CALL_LOG", "llm_calls.jsonl")))
    team = build_team()
    for task in tasks:
        await Console(team.run_stream(task=task))
        await team.reset()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or TASKS))
