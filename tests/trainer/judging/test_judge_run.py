"""LLM judges over span directories, against the scripted server: verdicts become evaluation
records that conversion turns into rewards; a second run asks nothing; unparsable verdicts
are retried then reported; malformed input is named and nothing else is lost; the judge's own
calls are never captured."""

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agl_bridge import semconv as sc
from agl_bridge.trainer.conversion import ConvertConfig, convert
from agl_bridge.trainer.judging import JudgeConfig, judge_spans
from agl_bridge.trainer.judging.cache import JudgeCache
from agl_bridge.trainer.rewards import evaluations as ev
from agl_bridge.trainer.rewards.judge import Rubric
from tests.factories import llm, table
from tests.scripted_server import ScriptedServer
from tests.span_files import all_rows

RUBRIC = Rubric("sum", "Is the final answer the right sum?", 0.0, 1.0)
ANSWERS = {"e1": ("t1", "5"), "e2": ("t1", "6"), "e3": ("t2", "5"), "e4": ("t2", "7")}


def genai(*pairs):
    return json.dumps([{"role": r, "parts": [{"type": "text", "content": t}]} for r, t in pairs])


def chat_row(episode, t, answer, *, task="t1", agent="solver", messages=True, ids=(1, 2),
             trace=None):
    row = llm(episode, t, task=task, agent=agent, trace=trace or f"trace-{episode}",
              prompt=ids, completion=None if ids is None else (t + 10, t + 11))
    if messages:
        row["attributes"] = json.dumps({
            sc.GEN_AI_INPUT_MESSAGES: genai(("system", "Add."), ("user", "2+3?")),
            sc.GEN_AI_OUTPUT_MESSAGES: genai(("assistant", answer))})
    return row


def write_spans(directory: Path, rows, name="part-0.parquet") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table(rows), directory / name)
    return directory


def store(tmp_path, answers=ANSWERS) -> Path:
    rows = [chat_row(e, i + 1, a, task=task) for i, (e, (task, a)) in enumerate(answers.items())]
    return write_spans(tmp_path / "spans", rows)


def evaluation_rows(directory):
    return [r for r in all_rows(directory) if r["evaluation_name"] is not None]


def absolute_script(body):
    """1 for an episode that answers 5, else 0.25."""
    episode = body["messages"][-1]["content"]
    score = 1.0 if "assistant: 5" in episode else 0.25
    return json.dumps({"explanation": f"answer {'right' if score == 1 else 'wrong'}",
                       "score": score}), []


def relative_script(body):
    """Every episode of the group scored: 0.9 for a right answer, else 0.1."""
    bodies = re.findall(r'<episode id="(\d+)">\n(.*?)\n</episode>', body["messages"][1]["content"],
                        re.DOTALL)
    return json.dumps({"scores": [{"id": int(i), "explanation": "compared",
                                   "score": 0.9 if "assistant: 5" in text else 0.1}
                                  for i, text in bodies]}), []


def rewards(directory, tmp_path):
    out = tmp_path / "transitions.parquet"
    stats = convert(directory, out, ConvertConfig())
    return {t["episode_id"]: t["reward"] for t in pq.read_table(out).to_pylist()}, stats


def judge(directory, server, rubric=RUBRIC, progress=False, episode_ids=None, **options):
    config = JudgeConfig(base_url=server.base_url, model="judge-m", **options)
    return judge_spans(directory, config, rubric=rubric, progress=progress,
                       episode_ids=episode_ids)


def test_absolute_scores_become_rewards_and_a_second_run_asks_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("AGL_BRIDGE_CAPTURE", "messages")  # explanations are kept at this level
    spans = store(tmp_path)
    with ScriptedServer(script=absolute_script) as server:
        first = judge(spans, server)
        assert (first.scored, first.cached, first.failed, first.requests) == (4, 0, {}, 4)
        assert first.parse_rate == 1.0 and "4 scored, 0 from the cache" in first.summary()
        assert all(r["model"] == "judge-m" and "seed" not in r for r in server.requests)
        second = judge(spans, server)
        assert len(server.requests) == 4  # nothing asked the second time
        assert (second.scored, second.cached, second.requests) == (0, 4, 0)
    got, stats = rewards(spans, tmp_path)
    assert got == {"e1": 1.0, "e2": 0.25, "e3": 1.0, "e4": 0.25}
    assert stats.notes[ev.JOINED] == 4 and stats.notes[ev.SUPERSEDED] == 0  # written once
    rows = evaluation_rows(spans)
    assert len(rows) == 4
    for row in rows:
        attributes = json.loads(row["attributes"])
        assert row["evaluation_name"] == "judge:sum" and row["reward_kind"] == "judge"
        assert row["evaluation_target"].startswith("episode:e")
        assert attributes[sc.JUDGE_MODEL] == "judge-m" and attributes[sc.JUDGE_MODE] == "absolute"
        assert attributes[sc.JUDGE_RUBRIC_SHA256] == RUBRIC.sha256
        assert attributes[sc.GEN_AI_EVALUATION_EXPLANATION].startswith("answer ")
    # conversion config weights the judge by its name
    out = tmp_path / "weighted.parquet"
    convert(spans, out, ConvertConfig(evaluation_weights={"judge:sum": 2.0}))
    assert sorted(t["reward"] for t in pq.read_table(out).to_pylist()) == [0.5, 0.5, 2.0, 2.0]


def test_explanations_stay_out_of_the_store_below_the_messages_level(tmp_path, monkeypatch):
    monkeypatch.delenv("AGL_BRIDGE_CAPTURE", raising=False)  # default level: token ids
    spans = store(tmp_path, {"e1": ("t1", "5")})
    with ScriptedServer(script=absolute_script) as server:
        assert judge(spans, server).scored == 1
    (row,) = evaluation_rows(spans)
    assert sc.GEN_AI_EVALUATION_EXPLANATION not in json.loads(row["attributes"])
    assert "answer right" not in JudgeCache(spans).path.read_text()


def test_relative_mode_scores_each_task_group_in_one_request(tmp_path):
    answers = {"a1": ("t1", "5"), "a2": ("t1", "6"), "a3": ("t1", "5"),
               "b1": ("t2", "9"), "b2": ("t2", "5"), "c1": (None, "5")}
    rows = [chat_row(e, i + 1, a, task=task) for i, (e, (task, a)) in enumerate(answers.items())]
    spans = write_spans(tmp_path / "spans", rows)
    with ScriptedServer(script=relative_script) as server:
        first = judge(spans, server, mode="relative")
        assert (first.scored, first.requests, first.failed) == (6, 3, {})
        sizes = sorted(len(re.findall(r'<episode id="', r["messages"][1]["content"]))
                       for r in server.requests)
        assert sizes == [1, 2, 3]  # t1 together, t2 together, the taskless episode alone
        assert all("<context shared by all episodes>" in r["messages"][1]["content"]
                   for r in server.requests if "<episode id=\"2\">" in r["messages"][1]["content"])
        # a new episode of t2 arrives: only its group is judged again
        write_spans(spans, [chat_row("b3", 50, "5", task="t2")], name="part-1.parquet")
        again = judge(spans, server, mode="relative")
        assert (again.requests, again.cached, again.scored) == (1, 4, 3)
        assert len(re.findall(r'<episode id="', server.requests[-1]["messages"][1]["content"])) == 3
    got, _ = rewards(spans, tmp_path)
    assert got == {"a1": 0.9, "a2": 0.1, "a3": 0.9, "b1": 0.1, "b2": 0.9, "b3": 0.9, "c1": 0.9}


def test_unparsable_verdicts_are_retried_then_reported_and_nothing_else_is_lost(tmp_path):
    spans = store(tmp_path, {"good": ("t1", "5"), "flaky": ("t1", "6"), "bad": ("t2", "7")})
    asked: dict[str, int] = {}
    lock = threading.Lock()

    def script(body):
        episode = body["messages"][1]["content"]
        which = "bad" if "assistant: 7" in episode else "flaky" if "assistant: 6" in episode \
            else "good"
        with lock:
            asked[which] = asked.get(which, 0) + 1
        if which == "bad":
            return "I really like this episode, it is great!", []
        if which == "flaky" and asked[which] == 1:
            return '{"score": 3}', []  # off the scale: asked again
        return json.dumps({"score": 0.5}), []

    with ScriptedServer(script=script) as server:
        summary = judge(spans, server, retries=2)
        assert summary.scored == 2 and list(summary.failed) == ["bad"]
        assert summary.failed["bad"] == (
            "unparsable verdict after 3 request(s): no JSON object with a \"score\" and no "
            "'score: X' in the answer; the answer began: 'I really like this episode, it is "
            "great!'")
        assert (summary.requests, summary.answers, summary.unparsable) == (6, 6, 4)
        assert asked == {"good": 1, "flaky": 2, "bad": 3}
        retried = [r for r in server.requests if "assistant: 7" in r["messages"][1]["content"]]
        assert [r["temperature"] for r in retried] == [0.0, 0.7, 0.7]  # retries sample
        assert "1 failed" in summary.summary() and "failed: episode bad: unparsable" in \
            summary.summary()
        # the failure is not cached: the next run asks only about it
        again = judge(spans, server, retries=0)
        assert (again.requests, again.cached, list(again.failed)) == (1, 2, ["bad"])
    got, _ = rewards(spans, tmp_path)
    assert got == {"good": 0.5, "flaky": 0.5}


def test_http_errors_and_timeouts_are_reported_with_the_episode(tmp_path):
    spans = store(tmp_path, {"e1": ("t1", "5")})
    with ScriptedServer(status=400, error_message=lambda b: "context too long") as server:
        summary = judge(spans, server, retries=2)
        assert len(server.requests) == 1  # a client error is not asked again
    assert summary.failed["e1"].startswith("HTTP 400 from http://127.0.0.1:")
    assert "context too long (after 1 request(s))" in summary.failed["e1"]
    with ScriptedServer(status=503) as server:
        summary = judge(spans, server, retries=1)
        assert len(server.requests) == 2  # a server error is
    assert "HTTP 503" in summary.failed["e1"] and "scripted failure" in summary.failed["e1"]

    def slow(body):
        time.sleep(1.5)
        return '{"score": 1}', []

    with ScriptedServer(script=slow) as server:
        summary = judge(spans, server, retries=0, timeout=0.3)
    assert summary.failed["e1"].startswith("no answer from http://127.0.0.1:")
    assert "within 0.3 s" in summary.failed["e1"]
    from agl_bridge.trainer.serving.vllm_server import free_port

    config = JudgeConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", retries=0)
    summary = judge_spans(spans, config, rubric=RUBRIC, progress=False)
    assert summary.failed["e1"].startswith("cannot reach http://127.0.0.1:")
    assert summary.scored == 0 and not evaluation_rows(spans)


def test_malformed_spans_are_named_and_the_other_episodes_judged(tmp_path):
    spans = tmp_path / "spans"
    bad_json = chat_row("badjson", 2, "5", trace="tb", ids=None)
    bad_json["attributes"] = "{not json"
    bad_messages = chat_row("badmsg", 3, "5", trace="tm")
    bad_messages["attributes"] = json.dumps({sc.GEN_AI_INPUT_MESSAGES: "[{oops",
                                             sc.GEN_AI_OUTPUT_MESSAGES: genai(("assistant", "5"))})
    ids_only = chat_row("idsonly", 4, "5", trace="ti", messages=False)
    nothing = chat_row("nothing", 5, "5", trace="tn", messages=False, ids=None)
    write_spans(spans, [chat_row("good", 1, "5", trace="tg"), bad_json, bad_messages,
                        ids_only, nothing])
    (spans / "junk.parquet").write_bytes(b"PAR1 this is not parquet")
    pq.write_table(pa.table({"x": [1]}), spans / "other.parquet")
    os.mkfifo(spans / "fifo.parquet")  # issue 30.7: it blocked the reader forever
    with ScriptedServer(script=absolute_script) as server:
        summary = judge(spans, server)
        assert len(server.requests) == 1
    assert summary.scored == 1 and summary.episodes == 1 and summary.unreadable == 4
    assert "1 scored, 0 from the cache, 0 failed; 4 episode(s) could not be read" in \
        summary.summary()
    assert summary.failed == {
        "badjson": f"span tb/{bad_json['span_id']}: neither messages nor token ids were "
                   f"captured (capture level none?)",
        "badmsg": f"{spans / 'part-0.parquet'}: span tm/{bad_messages['span_id']}: "
                  f"gen_ai.input.messages is not valid JSON (Expecting property name enclosed "
                  f"in double quotes: line 1 column 3 (char 2))",
        "idsonly": f"span ti/{ids_only['span_id']}: only token ids were captured; pass the "
                   f"served model's tokenizer (--tokenizer DIR) to read them",
        "nothing": f"span tn/{nothing['span_id']}: neither messages nor token ids were "
                   f"captured (capture level none?)"}
    problems = "\n".join(summary.problems)
    assert f"{spans / 'junk.parquet'}: unreadable (ArrowInvalid" in problems
    assert f"{spans / 'fifo.parquet'}: not a regular file; skipped" in problems
    (spans / "fifo.parquet").unlink()  # this test's own reader below reads every file
    assert f"{spans / 'other.parquet'}: not span Parquet (no column trace_id, span_id, " \
           f"operation_name); skipped" in problems
    assert f"{spans / 'part-0.parquet'}: span tb/{bad_json['span_id']}: attributes are not " \
           f"a JSON object" in problems
    assert [r["evaluation_target"] for r in evaluation_rows(spans)] == ["episode:good"]


def test_token_ids_are_read_with_the_served_models_tokenizer(tmp_path):
    from agl_bridge.trainer.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(tmp_path / "tok")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}],
                                           add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    answer = tokenizer.encode("It is 5.", add_special_tokens=False) + [tokenizer.eos_token_id]
    good = llm("ids", 1, prompt=prompt, completion=answer, trace="t1", agent="solver")
    off = llm("offvocab", 2, prompt=prompt, completion=[5, 99_999], trace="t2")
    spans = write_spans(tmp_path / "spans", [good, off])
    with ScriptedServer(reply='{"score": 1}') as server:
        summary = judge(spans, server, tokenizer=str(tmp_path / "tok"))
        (request,) = server.requests
    assert summary.scored == 1
    assert ("[solver] input: <|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
            in request["messages"][1]["content"])
    assert "[solver] output: It is 5.\n</episode>" in request["messages"][1]["content"]
    assert summary.failed == {"offvocab": f"span t2/{off['span_id']}: its token ids do not "
                              f"decode with this tokenizer (ValueError: id 99999 is outside "
                              f"the vocabulary of 320)"}
    with pytest.raises(ValueError, match=r"--tokenizer .*nowhere: cannot load a tokenizer"):
        judge_spans(spans, JudgeConfig(base_url="http://127.0.0.1:9/v1", model="m",
                                       tokenizer=str(tmp_path / "nowhere")),
                    rubric=RUBRIC, progress=False)


def test_a_corrupt_cache_line_is_reported_and_ignored(tmp_path):
    spans = store(tmp_path)
    with ScriptedServer(script=absolute_script) as server:
        judge(spans, server)
        cache = JudgeCache(spans).path
        lines = cache.read_text().splitlines()
        # a hand-edited line, and the first entry cut short by a crash at the end of the file
        cache.write_text(lines[0] + "\nnot json\n" + "\n".join(lines[1:]) + "\n"
                         + '{"key": "abc", "scores": {"e1": {"score": "x"}}}\n' + lines[0][:30])
        summary = judge(spans, server)
        assert len(server.requests) == 4 and summary.cached == 4
        assert [p.split(": ")[0] for p in summary.problems] == [f"{cache}:2", f"{cache}:6",
                                                                  f"{cache}:7"]
        assert all("corrupt cache line ignored" in p for p in summary.problems)
        # the next entry starts on a line of its own, after the cut one
        write_spans(spans, [chat_row("e5", 9, "5")], name="part-1.parquet")
        assert judge(spans, server).scored == 1
        assert JudgeCache(spans).get(json.loads(cache.read_text().splitlines()[-1])["key"])


def test_requests_run_concurrently_with_a_progress_bar_and_max_episodes(tmp_path, capsys):
    answers = {f"e{i}": ("t1", "5") for i in range(8)}
    spans = store(tmp_path, answers)
    inflight, peak = [0], [0]
    lock = threading.Lock()

    def script(body):
        with lock:
            inflight[0] += 1
            peak[0] = max(peak[0], inflight[0])
        time.sleep(0.2)
        with lock:
            inflight[0] -= 1
        return '{"score": 1}', []

    with ScriptedServer(script=script) as server:
        summary = judge(spans, server, concurrency=3, max_episodes=6, progress=True)
        assert len(server.requests) == 6
    assert summary.episodes == 6 and summary.scored == 6
    assert 1 < peak[0] <= 3
    assert "judging: 100%" in capsys.readouterr().err
    with ScriptedServer(script=lambda body: ('{"score": 1}', [])) as server:
        again = judge(spans, server, max_episodes=6, progress=False)  # the next ones
        assert len(server.requests) == 2
    assert again.cached == 6 and again.scored == 2 and again.episodes == 8


def test_episode_ids_limit_what_is_judged(tmp_path):
    spans = store(tmp_path, {f"e{i}": ("t1", "5") for i in range(5)})
    # episodes outside the set that could not be read are neither asked about nor reported
    # (the loop passes only new arrivals: old unreadable ones must not eat its budget)
    write_spans(spans, [chat_row("idsonly", 9, "5", messages=False)], "part-1.parquet")
    with ScriptedServer(script=lambda body: ('{"score": 1}', [])) as server:
        summary = judge(spans, server, episode_ids={"e1", "e3", "unknown"}, progress=False)
        assert len(server.requests) == 2
    assert summary.scored == 2 and summary.episodes == 2 and not summary.failed
    assert summary.unreadable == 0
    assert {r["evaluation_target"] for r in evaluation_rows(spans)} == {"episode:e1", "episode:e3"}


def test_structured_outputs_and_extra_fields_reach_the_server(tmp_path):
    spans = store(tmp_path, {"e1": ("t1", "5"), "e2": ("t1", "6")})
    with ScriptedServer(script=relative_script) as server:
        summary = judge(spans, server, mode="relative", structured=True,
                        extra_body={"top_k": 5, "max_tokens": 77})
        (body,) = server.requests
    assert summary.scored == 2
    schema = body["response_format"]["json_schema"]["schema"]
    assert body["response_format"]["type"] == "json_schema"
    assert schema["properties"]["scores"]["maxItems"] == 2
    assert body["top_k"] == 5 and body["max_tokens"] == 77  # extra fields win over ours


CLEAN = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGL_BRIDGE_"))}


def test_the_judges_calls_are_not_captured_under_zero_code_capture(tmp_path):
    spans = store(tmp_path)
    rubric = tmp_path / "sum.toml"
    rubric.write_text('instructions = "Is the sum right?"\n')
    env = dict(CLEAN, AGL_BRIDGE_AUTO="1", AGL_BRIDGE_PARQUET_DIR=str(spans),
               AGL_BRIDGE_CAPTURE="messages", OPENAI_API_KEY="k")

    def chat_spans():
        return sum(r["operation_name"] == "chat" for r in all_rows(spans))

    with ScriptedServer(script=absolute_script) as server:
        done = subprocess.run([sys.executable, "-m", "agl_bridge.cli", "judge", str(spans),
                               "--rubric", str(rubric), "--base-url", server.base_url,
                               "--model", "judge-m", "--quiet"], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "4 scored" in done.stdout and len(server.requests) == 4
        assert chat_spans() == 4  # the episodes' own calls, and nothing of the judge's
        assert len(evaluation_rows(spans)) == 4
        used = json.loads((spans / "_judge" / "settings.json").read_text())["judge"]
        assert used["model"] == "judge-m" and used["rubric"] == str(rubric)
        # the control: an openai call in the same set-up is captured, so the check above can fail
        control = ("import openai, sys; openai.OpenAI(base_url=sys.argv[1]).chat.completions"
                   ".create(model='judge-m', messages=[{'role': 'user', 'content': 'hi'}])")
        done = subprocess.run([sys.executable, "-c", control, server.base_url], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert chat_spans() == 5


def test_in_process_the_judge_records_no_llm_span(tmp_path, spans, instrumented):
    store_dir = store(tmp_path, {"e1": ("t1", "5")})
    with ScriptedServer(script=absolute_script) as server:
        assert judge(store_dir, server).scored == 1
    assert [s.name for s in spans.get_finished_spans() if s.name.startswith("chat")] == []


def agl(*args):
    exe = Path(sys.executable).with_name("agl-bridge")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True,
                          env=CLEAN, timeout=120)


def test_cli_errors_name_the_file_and_exit_codes_say_what_happened(tmp_path):
    spans = store(tmp_path, {"e1": ("t1", "5"), "e2": ("t1", "9")})
    bad = tmp_path / "bad.toml"
    bad.write_text('instructions = "x"\nscale = [1, 0]\n')
    out = agl("judge", spans, "--rubric", bad, "--base-url", "http://127.0.0.1:9/v1",
              "--model", "m")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"agl-bridge judge: error: rubric {bad}: scale must be finite with low < high" \
           in out.stderr
    out = agl("judge", tmp_path / "absent", "--rubric", bad, "--base-url", "http://x/v1",
              "--model", "m")
    assert out.returncode == 2 and "not a span directory" in out.stderr
    out = agl("judge", spans, "--rubric", bad, "--base-url", "http://x/v1", "--model", "m",
              "--extra-body", "[1]")
    assert out.returncode == 2 and "--extra-body: '[1]': expected a JSON object" in out.stderr
    text = tmp_path / "right-sum.txt"
    text.write_text("Is the final answer the right sum?")

    def script(body):
        wrong = "assistant: 9" in body["messages"][1]["content"]
        return ("no idea" if wrong else '{"score": 1}'), []

    with ScriptedServer(script=script) as server:
        out = agl("judge", spans, "--rubric", text, "--base-url", server.base_url, "--model",
                  "judge-m", "--retries", "0", "--quiet")
    assert out.returncode == 1, out.stderr
    assert "rubric judge:right-sum: 2 episode(s): 1 scored" in out.stdout
    assert "failed: episode e2: unparsable verdict after 1 request(s)" in out.stdout
