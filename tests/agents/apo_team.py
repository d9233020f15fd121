"""A team command for the APO tests, configured by environment only (as the loop runs one): one
agent, ``solver``, with its own system prompt, asked to say a number; the episode's reward is 1
when the reply holds the number. Results go to AGL_BRIDGE_RESULTS with the episode id and
score. No prompt code: the prompt swap gives the solver whatever the prompt table says. A
replayed live input (the loop's replay) has the number as the attribute recorded here.
``APO_TEAM_CHECKER=1`` adds a second agent, ``checker`` (its own prompt ``CHECKER``), asked the
same; the team's score is then the mean of the two, and each agent's own is in
``agent_score``."""

import json
import os

import openai
from opentelemetry import trace

import agl_bridge

CHECKER = "You check numbers."
client = openai.OpenAI()
rollouts = int(os.environ["AGL_BRIDGE_ROLLOUTS"])
tasks = [json.loads(line) for line in open(os.environ["AGL_BRIDGE_TASKS"])]
agents = {"solver": "You are a helpful assistant."}
if os.environ.get("APO_TEAM_CHECKER"):
    agents["checker"] = CHECKER


def says(system: str, number: int) -> float:
    reply = client.chat.completions.create(model="base", max_tokens=8, messages=[
        {"role": "system", "content": system}, {"role": "user", "content": f"say {number}"}])
    return float(str(number) in (reply.choices[0].message.content or ""))


with open(os.environ["AGL_BRIDGE_RESULTS"], "w") as results:
    for task in tasks:
        if "number" not in task:  # a replayed input: the attribute recorded below
            task["number"] = task["app.number"]
        for _ in range(rollouts):
            own = {}
            with agl_bridge.episode(task_id=task["task_id"]) as episode:
                for name, system in agents.items():
                    with agl_bridge.agent(name):
                        trace.get_current_span().set_attribute("app.number", task["number"])
                        own[name] = says(system, task["number"])
                        agl_bridge.emit_reward(own[name])
            line = {"task_id": task["task_id"], "episode_id": episode,
                    "score": sum(own.values()) / len(own)}
            if len(agents) > 1:
                line["agent_score"] = own
            results.write(json.dumps(line) + "\n")
