"""A production app: one request per ticket, never repeated, no reward; each episode records
the ticket's priority as an attribute of its span. Usage: ticket_app.py BASE_URL"""

import sys

import openai
from opentelemetry import trace

import agl_bridge

client = openai.OpenAI(base_url=sys.argv[1], api_key="k")
for number, (text, priority) in enumerate([("server down", "high"), ("typo on page", "low"),
                                           ("cannot log in", "high")]):
    with agl_bridge.episode(f"ticket-{number}"), agl_bridge.agent("triage"):
        trace.get_current_span().set_attribute("ticket.priority", priority)
        client.chat.completions.create(
            model="triage", messages=[{"role": "system", "content": "Triage the ticket."},
                                      {"role": "user", "content": text}])
