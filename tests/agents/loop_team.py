"""A team command as the loop runs it: plain openai, configured by environment only
(agl_bridge.trainer.loop.team). One agent, ``solver``, is asked to repeat a number; the episode's
reward is 1 when it does. Its results go to AGL_BRIDGE_RESULTS with a score per episode, the
solver's own (``agent_score``) and the decoding it was asked for. ``--team-fails``: the team's
score is always 0 (a team whose success is near 0), the solver's own still counts.
``--checker``: a second agent, ``checker``, repeats the number after the solver, with its own
score and reward."""

import json
import os
import sys

import openai
from opentelemetry import trace

import agl_bridge

client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the loop
rollouts = int(os.environ["AGL_BRIDGE_ROLLOUTS"])
temperature = float(os.environ["AGL_BRIDGE_TEMPERATURE"])
tasks = [json.loads(line) for line in open(os.environ["AGL_BRIDGE_TASKS"])]
with open(os.environ["AGL_BRIDGE_RESULTS"], "w") as results:
    for task in tasks:
        for _ in range(rollouts):
            scores = {}
            with agl_bridge.episode(task_id=task["task_id"]) as episode:
                if "number" not in task:  # a replayed input: the attribute recorded below
                    task["number"] = task["app.number"]
                for agent in ("solver", "checker") if "--checker" in sys.argv else ("solver",):
                    with agl_bridge.agent(agent):
                        # what the app records about its request (the loop's replay reads it)
                        trace.get_current_span().set_attribute("app.number", task["number"])
                        reply = client.chat.completions.create(
                            model=agent, temperature=temperature, max_tokens=8,
                            messages=[{"role": "user", "content": f"say {task['number']}"}])
                        scores[agent] = float(
                            str(task["number"]) in (reply.choices[0].message.content or ""))
                        agl_bridge.emit_reward(scores[agent])
            score = min(scores.values())
            results.write(json.dumps({
                "task_id": task["task_id"], "episode_id": episode,
                "score": 0.0 if "--team-fails" in sys.argv else score,
                "agent_score": scores, "temperature": temperature,
                "rollouts": rollouts}) + "\n")
print(json.dumps({"episodes": len(tasks) * rollouts}))
