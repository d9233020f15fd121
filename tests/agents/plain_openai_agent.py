"""An agent program that knows nothing of agl-bridge: plain openai client, sync, async and a
thread pool. Usage: plain_openai_agent.py BASE_URL [--own-provider FILE]"""

import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor

import openai

base_url = sys.argv[1]
if "--own-provider" in sys.argv:
    # an application that configures OpenTelemetry itself, after start-up
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    out = open(sys.argv[sys.argv.index("--own-provider") + 1], "w")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out)))
    trace.set_tracer_provider(provider)

client = openai.OpenAI(base_url=base_url, api_key="k")
reply = client.chat.completions.create(model="solver",
                                       messages=[{"role": "user", "content": "1+1"}])
print(reply.choices[0].message.content)


async def main():
    aclient = openai.AsyncOpenAI(base_url=base_url, api_key="k")
    r = await aclient.chat.completions.create(model="checker",
                                             messages=[{"role": "user", "content": "ok?"}])
    print(r.choices[0].message.content)

asyncio.run(main())
with ThreadPoolExecutor(2) as pool:
    print(pool.submit(lambda: client.chat.completions.create(
        model="tool-agent", messages=[{"role": "user", "content": "x"}]).choices[0].message.content
    ).result())
