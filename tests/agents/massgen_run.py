"""Drive the real MassGen against an OpenAI-compatible server: two agents answer, vote, and the
winner presents. The program knows nothing of agl-bridge; capture comes from AGL_BRIDGE_AUTO.
Usage: massgen_run.py BASE_URL [SYSTEM_MESSAGES] (run from a scratch directory: MassGen writes
./.massgen); SYSTEM_MESSAGES, a JSON object, gives agents their own system_message."""

import asyncio
import json
import sys

import massgen
from massgen.token_manager.token_manager import TokenCostCalculator

# This machine has no network: MassGen would try to download a pricing file after every call.
TokenCostCalculator._fetch_litellm_pricing = lambda self: None

base_url = sys.argv[1]
system = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
config = {"agents": [
    {"id": agent, "backend": {"type": "chatcompletion", "model": f"m-{agent}",
                              "base_url": base_url},
     **({"system_message": system[agent]} if agent in system else {})}
    for agent in ("agent_a", "agent_b")]}
result = asyncio.run(massgen.run(query="What is 2+3?", config_dict=config))
print(json.dumps({"selected_agent": result.get("selected_agent"),
                  "final_answer": result.get("final_answer")}))
