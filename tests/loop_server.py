"""The loop tests' vLLM stand-in: a scripted server that repeats the number it is asked to say,
except for the adapter versions a test names, which answer wrongly, so "worse" is
deterministic for the gate and the watch."""

from __future__ import annotations

import re

from tests.scripted_server import ScriptedServer


def server_for(bad: set[str]) -> ScriptedServer:
    """A vLLM stand-in whose named versions answer wrongly and all others rightly."""
    def script(body):
        if body["model"] in bad:
            return "no", []
        match = re.search(r"say (\d+)", body["messages"][-1]["content"])
        return (match.group(1) if match else "ok"), []
    return ScriptedServer(vllm=True, lora=True, base_model="base", script=script,
                          completion_ids=[11, 12])
