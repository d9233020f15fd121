"""An AutoGen team with no agl-bridge code: a writer answers, a reviewer reads the answer, each
with its own system message. Run under ``AGL_BRIDGE_AUTO=1`` with ``AGL_BRIDGE_PROMPTS`` set,
the agents' system messages are whatever the prompt table says is live (the prompt swap tests).

Environment: ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``."""

import asyncio
import os

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

MODEL_INFO = {"vision": False, "function_calling": False, "json_output": False,
              "family": "unknown", "structured_output": False}


async def main() -> None:
    client = OpenAIChatCompletionClient(model="base", base_url=os.environ["OPENAI_BASE_URL"],
                                        api_key=os.environ["OPENAI_API_KEY"],
                                        model_info=MODEL_INFO, max_retries=0)
    writer = AssistantAgent("writer", model_client=client, system_message="You write answers.")
    reviewer = AssistantAgent("reviewer", model_client=client,
                              system_message="You review the writer's answer.")
    team = RoundRobinGroupChat([writer, reviewer], max_turns=2)
    await team.run(task="Compute 2 + 3.")


asyncio.run(main())
