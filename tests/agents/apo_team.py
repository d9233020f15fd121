"""A team command for the APO tests, configured by environment only (as the loop runs one): one
agent, ``solver``, with its own system prompt, asked to say a number; the episode's reward is 1
when the reply holds the number. Results go to AGL_BRIDGE_RESULTS with the episode id and
score. No prompt code: the prompt swap gives the solver whatever the prompt table says. A
replayed live input (the loop's replay) has the number as the attribute recorded here."""

import json
import os

import openai
from opentelemetry import trace

import agl_bridge

client = openai.OpenAI()
rollouts = int(os.environ["AGL_BRIDGE_ROLLOUTS"])
tasks = [json.loads(line) for line in open(os.environ["AGL_BRIDGE_TASKS"])]
with open(os.environ["AGL_BRIDGE_RESULTS"], "w") as results:
    for task in tasks:
        if "number" not in task:  # a replayed input: the attribute recorded below
            task["number"] = task["app.number"]
        for _ in range(rollouts):
            with agl_bridge.episode(task_id=task["task_id"]) as episode, \
                    agl_bridge.agent("solver"):
                trace.get_current_span().set_attribute("app.number", task["number"])
                reply = client.chat.completions.create(model="base", max_tokens=8, messages=[
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": f"say {task['number']}"}])
                score = float(str(task["number"]) in (reply.choices[0].message.content or ""))
                agl_bridge.emit_reward(score)
            results.write(json.dumps({"task_id": task["task_id"], "episode_id": episode,
                                      "score": score}) + "\n")
