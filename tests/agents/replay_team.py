"""A team command that plays replayed inputs: it sends each task's captured messages again
(AGL_BRIDGE_TASKS with ``messages``), scores the answer by whether it says the ticket's
priority the field named ``ticket.priority`` holds, and emits that reward."""

import json
import os

import openai

import agl_bridge

client = openai.OpenAI()
rollouts = int(os.environ["AGL_BRIDGE_ROLLOUTS"])
tasks = [json.loads(line) for line in open(os.environ["AGL_BRIDGE_TASKS"])]
for task in tasks:
    for _ in range(rollouts):
        with agl_bridge.episode(task_id=task["task_id"]), agl_bridge.agent("triage"):
            reply = client.chat.completions.create(model="triage", messages=task["messages"])
            text = reply.choices[0].message.content or ""
            agl_bridge.emit_reward(float(task.get("ticket.priority", "") in text))
