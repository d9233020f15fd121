"""A production-style app: each request answered once, no reward anywhere, no agl-bridge code.
It prints what it would log for its users: one JSON line per request with the OpenAI response
id. Usage: feedback_app.py BASE_URL N"""

import json
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1], api_key="k")
for i in range(int(sys.argv[2])):
    reply = client.chat.completions.create(
        model="assistant", messages=[{"role": "user", "content": f"request {i}"}])
    print(json.dumps({"request": i, "response_id": reply.id}), flush=True)
