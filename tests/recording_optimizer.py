"""An APO optimizer for tests that only records: it keeps the prompt each critique and rewrite
was given and proposes nothing new (so no candidate is played)."""


class RecordingOptimizer:
    def __init__(self) -> None:
        self.prompts: list[str] = []

    def critique(self, agent, prompt, best, worst):
        self.prompts.append(prompt)
        return "Say the number."

    def rewrite(self, agent, prompt, critique, temperature):
        self.prompts.append(prompt)
        return None
