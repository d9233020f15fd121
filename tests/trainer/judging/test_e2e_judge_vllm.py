"""End to end on a real vLLM (the tiny random model): episodes captured from the server at the
default level (token ids only), then judged by the same server, their text decoded with its
tokenizer. The tiny model's verdicts are random bytes, so what is checked is the pipeline:
every unparsable verdict is asked again, then reported by episode; nothing crashes; nothing
is cached or written for them; with the answer constrained to a verdict (vLLM's structured
outputs) the scores are written, convert into rewards and a second run asks nothing. The
judge's calls, made while the openai instrumentor is on, leave no LLM span."""

import json

import openai
import pyarrow.parquet as pq
import pytest

import agl_bridge
from agl_bridge.parquet_io import iter_parquet_files
from agl_bridge.trainer.conversion import ConvertConfig, convert
from agl_bridge.trainer.judging import JudgeConfig, judge_spans
from agl_bridge.trainer.judging.cache import JudgeCache
from agl_bridge.trainer.rewards.judge import Rubric
from tests.span_files import spans_to_table

pytestmark = pytest.mark.e2e

RUBRIC = Rubric("sum", "Is the final answer the right sum?")
EPISODES = [("e1", "t1", "add 2 and 3"), ("e2", "t1", "add 2 and 3"),
            ("e3", "t2", "add 7 and 8"), ("e4", "t2", "add 7 and 8")]
VERDICT = r'\{"score": [01]\}'  # the only answers vLLM may give once constrained
GROUP_VERDICT = r'\{"scores": \[\{"id": 1, "score": [01]\}, \{"id": 2, "score": [01]\}\]\}'


@pytest.fixture(scope="module")
def vllm(tiny_vllm):
    # the suite's shared server (tests/conftest.py): the tiny tokenizer is byte-level, so a
    # judge prompt is 1-3k tokens, and it serves 4096 positions for it
    return tiny_vllm


@pytest.fixture
def captured(vllm, spans, instrumented, tmp_path):
    """Four episodes of two tasks, captured from vLLM at the default level (ids, no text)."""
    client = openai.OpenAI(base_url=vllm.base_url, api_key="k")
    for episode, task, prompt in EPISODES:
        with agl_bridge.episode(episode, task_id=task), agl_bridge.agent("solver"):
            client.chat.completions.create(model="tiny", max_tokens=8, temperature=0.0,
                                           messages=[{"role": "user", "content": prompt}])
    directory = tmp_path / "spans"
    directory.mkdir()
    pq.write_table(spans_to_table(list(spans.get_finished_spans())),
                   directory / "episodes.parquet")
    spans.clear()
    return directory


def chat_spans(exporter):
    return [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]


def evaluations(directory):
    rows = [r for p in iter_parquet_files(directory) for r in pq.read_table(p).to_pylist()]
    return {r["evaluation_target"]: r["evaluation_score"] for r in rows
            if r.get("evaluation_name") == RUBRIC.evaluation_name}


def test_the_judge_on_vllm_retries_reports_caches_and_scores(vllm, captured, spans, tmp_path):
    options = dict(base_url=vllm.base_url, model="tiny", tokenizer=str(vllm.model_dir),
                   concurrency=2, max_tokens=24)
    free = judge_spans(captured, JudgeConfig(retries=1, **options), rubric=RUBRIC,
                       progress=False)
    assert (free.episodes, free.unreadable, free.requests, free.answers) == (4, 0, 8, 8)
    assert free.scored == 0 and free.unparsable == 8 and sorted(free.failed) == [
        "e1", "e2", "e3", "e4"]
    for why in free.failed.values():
        assert why.startswith("unparsable verdict after 2 request(s): ") and "began:" in why
    assert evaluations(captured) == {} and not JudgeCache(captured).entries

    constrained = JudgeConfig(**options, extra_body={"structured_outputs": {"regex": VERDICT}})
    scored = judge_spans(captured, constrained, rubric=RUBRIC, progress=False)
    assert (scored.scored, scored.requests, scored.failed) == (4, 4, {})
    scores = evaluations(captured)
    assert sorted(scores) == ["episode:e1", "episode:e2", "episode:e3", "episode:e4"]
    assert set(scores.values()) <= {0.0, 1.0}
    again = judge_spans(captured, constrained, rubric=RUBRIC, progress=False)
    assert (again.requests, again.cached, again.scored) == (0, 4, 0)

    out = tmp_path / "transitions.parquet"
    convert(captured, out, ConvertConfig())
    got = {t["episode_id"]: t["reward"] for t in pq.read_table(out).to_pylist()}
    assert got == {k.removeprefix("episode:"): v for k, v in scores.items()}
    assert chat_spans(spans) == []  # 16 judge requests with the instrumentor on: none recorded


def test_relative_judging_on_vllm_one_request_per_task(vllm, captured, spans):
    config = JudgeConfig(base_url=vllm.base_url, model="tiny", tokenizer=str(vllm.model_dir),
                         mode="relative", max_tokens=96,
                         extra_body={"structured_outputs": {"regex": GROUP_VERDICT}})
    first = judge_spans(captured, config, rubric=RUBRIC, progress=False)
    assert (first.scored, first.requests, first.failed) == (4, 2, {})
    entries = list(JudgeCache(captured).entries.values())
    assert sorted(sorted(e["scores"]) for e in entries) == [["e1", "e2"], ["e3", "e4"]]
    assert all(e["mode"] == "relative" and e["model"] == "tiny" for e in entries)
    second = judge_spans(captured, config, rubric=RUBRIC, progress=False)
    assert (second.requests, second.cached) == (0, 4)
    assert json.loads(json.dumps(evaluations(captured))).keys() == {
        "episode:e1", "episode:e2", "episode:e3", "episode:e4"}
    assert chat_spans(spans) == []
