"""An agent program that knows nothing of agl-bridge and asks for the model alias ``coder``:
once as usual, once inside OpenTelemetry's ``suppress_instrumentation()`` (as an application
might around calls it does not want traced). Prints the model that answered each call.
Usage: aliased_agent.py BASE_URL"""

import sys

import openai
from opentelemetry.instrumentation.utils import suppress_instrumentation

client = openai.OpenAI(base_url=sys.argv[1], api_key="k")
messages = [{"role": "user", "content": "2+2?"}]
print(client.chat.completions.create(model="coder", messages=messages).model)
with suppress_instrumentation():
    print(client.chat.completions.create(model="coder", messages=messages).model)
