"""A team command for the APO tests, configured by environment only (as the loop runs one): one
agent, ``solver``, with its own system prompt, asked to say a number; the episode's reward is 1
when the reply holds the number. Results go to AGL_BRIDGE_RESULTS with the episode id and
score. No prompt code: the prompt swap gives the solver whatever the prompt table says."""

import json
import os

import openai

import agl_bridge

client = openai.OpenAI()
rollouts = int(os.environ["AGL_BRIDGE_ROLLOUTS"])
tasks = [json.loads(line) for line in open(os.environ["AGL_BRIDGE_TASKS"])]
with open(os.environ["AGL_BRIDGE_RESULTS"], "w") as results:
    for task in tasks:
        for _ in range(rollouts):
            with agl_bridge.episode(task_id=task["task_id"]) as episode, \
                    agl_bridge.agent("solver"):
                reply = client.chat.completions.create(model="base", max_tokens=8, messages=[
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": f"say {task['number']}"}])
                score = float(str(task["number"]) in (reply.choices[0].message.content or ""))
                agl_bridge.emit_reward(score)
            results.write(json.dumps({"task_id": task["task_id"], "episode_id": episode,
                                      "score": score}) + "\n")
