"""What the OpenAI instrumentor's tests read from the ``spans`` fixture."""


def chat_spans(spans):
    return [s for s in spans.get_finished_spans() if s.name.startswith("chat")]
