"""LLM judges, the pure part: rubrics, what the judge reads of an episode, prompts for both
modes, verdict parsing (good, malformed, out of range, partial), groups and cache keys."""

import json

import pytest

from agl_bridge.trainer.rewards import judge as j
from agl_bridge.trainer.rewards.judge_text import Call, EpisodeTextError, episode_blocks

RUBRIC = j.Rubric("helpful", "Reward correct, short answers.", 0.0, 1.0)


def msgs(*pairs):
    return [{"role": role, "parts": [{"type": "text", "content": text}]} for role, text in pairs]


def ep(name, task="t", blocks=("[a] user: hi", "[a] assistant: hello"), start=0):
    return j.EpisodeText(name, task, tuple(blocks), start)


# -- rubrics -----------------------------------------------------------------------------------
def test_rubrics_from_toml_and_plain_text():
    r = j.parse_rubric('name = "math"\ninstructions = """Is the sum right?"""\nscale = [0, 10]\n',
                       source="r.toml", toml=True, default_name="r")
    assert (r.name, r.instructions, r.low, r.high) == ("math", "Is the sum right?", 0.0, 10.0)
    assert r.evaluation_name == "judge:math"
    plain = j.parse_rubric("  Be kind.\n", source="kind.txt", toml=False, default_name="kind")
    assert (plain.name, plain.instructions, plain.low, plain.high) == ("kind", "Be kind.", 0, 1)
    assert j.parse_rubric('instructions = "x"', source="f.toml", toml=True,
                          default_name="f").name == "f"


def test_the_rubric_digest_follows_text_and_scale():
    same = j.Rubric("helpful", "Reward correct, short answers.", 0.0, 1.0)
    assert same.sha256 == RUBRIC.sha256
    assert j.Rubric("helpful", "Reward correct answers.", 0, 1).sha256 != RUBRIC.sha256
    assert j.Rubric("helpful", RUBRIC.instructions, 0, 10).sha256 != RUBRIC.sha256


@pytest.mark.parametrize(("text", "toml", "message"), [
    ("name = [", True, "r.toml: not valid TOML"),
    ('instructions = "x"\nscael = [0, 1]', True, "unknown key(s) scael"),
    ('name = "n"', True, "no 'instructions'"),
    ('instructions = "x"\nscale = [1]', True, "'scale' must be two numbers"),
    ('instructions = "x"\nscale = ["0", 1]', True, "'scale' must be two numbers"),
    ('instructions = "x"\nscale = [1, 1]', True, "low < high"),
    ('instructions = 3', True, "'instructions' must be a string"),
    ('name = "two words"\ninstructions = "x"', True, "name 'two words' must be"),
    ("   \n", False, "the instructions are empty"),
])
def test_bad_rubrics_are_refused_by_name(text, toml, message):
    with pytest.raises(j.RubricError, match=r"rubric r\.toml: ") as info:
        j.parse_rubric(text, source="r.toml", toml=toml, default_name="r")
    assert message in str(info.value)


# -- what the judge reads ---------------------------------------------------------------------
def test_messages_are_shown_once_per_agent_with_names_and_tools():
    first = Call("T/1", "planner", 1, msgs(("system", "Plan."), ("user", "Add 2 and 3.")),
                 msgs(("assistant", "Ask the solver.")))
    other = Call("T/2", "solver", 2, msgs(("user", "Add 2 and 3.")), [{
        "role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "add",
                                        "arguments": '{"a": 2, "b": 3}'}]}])
    # the planner's second call repeats its conversation and adds the tool's answer
    again = Call("T/3", "planner", 3, msgs(("system", "Plan."), ("user", "Add 2 and 3."),
                                           ("assistant", "Ask the solver."))
                 + [{"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1",
                                                "response": 5}]}],
                 msgs(("assistant", "5")))
    blocks = episode_blocks([again, other, first], decode=None)  # any order in, time order out
    assert blocks == (
        "[planner] system: Plan.", "[planner] user: Add 2 and 3.",
        "[planner] assistant: Ask the solver.",
        "[solver] user: Add 2 and 3.", '[solver] assistant: [calls add({"a": 2, "b": 3})]',
        "[planner] tool: [result of c1] 5", "[planner] assistant: 5")


def test_token_ids_are_decoded_incrementally_and_failed_calls_said():
    def decode(ids, is_prompt):
        return ("P" if is_prompt else "C") + "".join(map(str, ids))

    calls = [Call("T/1", "a", 1, prompt_ids=[1, 2], completion_ids=[3]),
             Call("T/2", "a", 2, prompt_ids=[1, 2, 3, 4], completion_ids=[5]),
             Call("T/3", "b", 3, prompt_ids=[1, 2], completion_ids=None, failed="HTTP 500"),
             Call("T/4", "b", 4, failed="timeout")]
    assert episode_blocks(calls, decode) == (
        "[a] input: P12", "[a] output: C3", "[a] input: P4", "[a] output: C5",
        "[b] input: P12", "[b] (no answer: the call failed: HTTP 500)",
        "[b] (a call failed: timeout)")


@pytest.mark.parametrize(("call", "decode", "message"), [
    (Call("T/9", "a", 1, prompt_ids=[1], completion_ids=[2]), None,
     "span T/9: only token ids were captured; pass the served model's tokenizer"),
    (Call("T/9", "a", 1), None, "span T/9: neither messages nor token ids"),
    (Call("T/9", "a", 1, inputs={"role": "user"}), None,
     "span T/9: gen_ai.input.messages is not a list of messages"),
    (Call("T/9", "a", 1, inputs=[{"role": "user", "parts": "hi"}]), None,
     "span T/9: gen_ai.input.messages[0] is not a message with parts"),
    (Call("T/9", "a", 1, outputs=[{"role": "assistant", "parts": ["hi"]}]), None,
     "span T/9: a message part is not an object"),
    (Call("T/9", "a", 1, prompt_ids=[1], completion_ids=[99]),
     lambda ids, p: (_ for _ in ()).throw(ValueError("id 99 is outside the vocabulary")),
     "span T/9: its token ids do not decode with this tokenizer (ValueError: id 99"),
])
def test_calls_that_cannot_be_read_are_named(call, decode, message):
    with pytest.raises(EpisodeTextError) as info:
        episode_blocks([Call("T/1", "a", 0, msgs(("user", "x")), msgs(("assistant", "y"))),
                        call], decode)
    assert message in str(info.value)


# -- prompts -----------------------------------------------------------------------------------
def test_the_absolute_prompt_holds_rubric_scale_and_episode():
    r = j.Rubric("math", "Is the final sum right?", 0, 10)
    system, user = j.absolute_messages(r, ep("e1"))
    assert system["role"] == "system" and user["role"] == "user"
    assert "Is the final sum right?" in system["content"] and "from 0 to 10" in system["content"]
    assert '"score"' in system["content"]
    assert user["content"].startswith("<episode>\n[a] user: hi\n[a] assistant: hello\n"
                                      "</episode>\n\nScore this episode. Answer with one JSON")
    assert user["content"].endswith('"score": <a number from 0 to 10>}')  # the format, last


def test_long_episodes_keep_their_start_and_end():
    text = "S" * 50 + "M" * 1000 + "E" * 30
    short = j.shorten(text, 120)
    assert short.startswith("S" * 50) and short.endswith("E" * 30)
    assert "[... 960 characters omitted ...]" in short and j.shorten("abc", 120) == "abc"


def test_the_relative_prompt_shows_the_shared_task_once_and_numbers_the_episodes():
    task = ("[a] system: Add.", "[a] user: 2+3?")
    group = [ep("run-alpha", blocks=task + ("[a] assistant: 5",)),
             ep("run-beta", blocks=task + ("[a] assistant: 6",)), ep("run-gamma", blocks=task)]
    assert j.common_prefix(group) == 2
    system, user = j.relative_messages(RUBRIC, group)
    assert "All 3 episodes" in system["content"] and "from 1 to 3" in system["content"]
    assert "Reward correct, short answers." in system["content"]
    body = user["content"]
    assert body.count("[a] user: 2+3?") == 1  # the shared task, once
    assert body.startswith("<context shared by all episodes>\n[a] system: Add.\n[a] user: 2+3?")
    assert '<episode id="1">\n[a] assistant: 5\n</episode>' in body
    assert '<episode id="2">\n[a] assistant: 6\n</episode>' in body
    assert '<episode id="3">\n(nothing beyond the shared context)\n</episode>' in body
    assert body.endswith('"score": <a number from 0 to 1>}, ...]}')  # the format, last
    assert "run-" not in body + system["content"]  # real ids never reach the judge
    same = [ep("x"), ep("y")]
    assert j.common_prefix(same) == 0 and "<context" not in j.relative_messages(
        RUBRIC, same)[1]["content"]


def test_the_verdict_schema_bounds_scores_and_ids():
    r = j.Rubric("r", "x", -1, 1)
    absolute = j.verdict_schema(j.ABSOLUTE, r)
    assert absolute["properties"]["score"] == {"type": "number", "minimum": -1, "maximum": 1}
    relative = j.verdict_schema(j.RELATIVE, r, 3)
    assert relative["properties"]["scores"]["minItems"] == 3
    assert relative["properties"]["scores"]["items"]["properties"]["id"]["maximum"] == 3


# -- verdicts ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("answer", "value", "explanation"), [
    ('{"explanation": "Right.", "score": 0.8}', 0.8, "Right."),
    ('```json\n{"score": 1, "explanation": "ok"}\n```', 1.0, "ok"),
    ('Sure! Here it is: {"Score": "0.25", "reason": "meh"} Hope it helps {', 0.25, "meh"),
    ('{"note": {"a": 1}} then {"score": 0}', 0.0, None),
    ("The episode is fine.\nScore: 0.7", 0.7, None),
    ('"score": 0.5, "score": 0.5 (repeated)', 0.5, None),
])
def test_absolute_verdicts_are_read_through_their_wrapping(answer, value, explanation):
    score = j.parse_absolute(answer, RUBRIC)
    assert score.value == value and score.explanation == explanation


@pytest.mark.parametrize(("answer", "message"), [
    ("I think it is good.", "no JSON object with a \"score\""),
    ("", "no JSON object"),
    ('{"score": 1.5}', "score is 1.5, outside the rubric's scale 0 to 1"),
    ("score: -2", "score is -2, outside"),
    ('{"score": "high"}', "score is 'high', not a number"),
    ('{"score": true}', "score is True, not a finite number"),
    ('{"score": NaN}', "score is nan, not a finite number"),
    ("score: 0.2 ... no wait, score: 0.9", "several different scores in the answer: 0.2, 0.9"),
])
def test_bad_absolute_verdicts_say_what_is_wrong(answer, message):
    with pytest.raises(j.VerdictError) as info:
        j.parse_absolute(answer, RUBRIC)
    assert message in str(info.value)


def test_relative_verdicts_in_their_usual_shapes():
    listed = json.dumps({"scores": [{"id": 2, "explanation": "worse", "score": 0.2},
                                    {"id": "1", "explanation": "better", "score": 0.9}]})
    assert j.parse_relative(listed, 2, RUBRIC) == [j.Score(0.9, "better"),
                                                   j.Score(0.2, "worse")]
    ruler = json.dumps({"scores": [{"trajectory_id": "episode 1", "score": 1},
                                   {"trajectory_id": "#2", "score": 0}]})
    assert [s.value for s in j.parse_relative(ruler, 2, RUBRIC)] == [1.0, 0.0]
    mapping = 'Verdict: {"scores": {"1": 0.4, "2": {"score": 0.6}}}'
    assert [s.value for s in j.parse_relative(mapping, 2, RUBRIC)] == [0.4, 0.6]


@pytest.mark.parametrize(("scores", "message"), [
    ([{"id": 1, "score": 0.5}], "no score for episode(s) 2, 3 of 3"),  # partial
    ([{"id": 1, "score": 0.5}, {"id": 1, "score": 0.6}, {"id": 2, "score": 0}],
     "episode 1 is scored twice"),
    ([{"id": 4, "score": 0.5}], "unknown episode id 4 (expected 1 to 3)"),
    ([{"id": "best", "score": 0.5}], "unknown episode id 'best'"),
    ([{"id": 1, "score": 0.5}, {"id": 2, "score": 1.5}, {"id": 3, "score": 0}],
     "score of episode 2 is 1.5, outside the rubric's scale 0 to 1"),
    ([{"id": 1}], "episode 1 has no \"score\""),
    ([{"score": 1}], "entry 1 of \"scores\" has no \"id\""),
    ([0.5, 0.2, 0.1], "entry 1 of \"scores\" is not an object"),
])
def test_bad_relative_verdicts_say_what_is_wrong(scores, message):
    with pytest.raises(j.VerdictError) as info:
        j.parse_relative(json.dumps({"scores": scores}), 3, RUBRIC)
    assert message in str(info.value)
    with pytest.raises(j.VerdictError, match="no JSON object with a \"scores\" list"):
        j.parse_relative('{"score": 0.5}', 3, RUBRIC)


def test_a_verdict_maps_back_to_the_real_episode_ids_in_prompt_order():
    group = [ep("ep-b"), ep("ep-a")]
    answer = '{"scores": [{"id": 1, "score": 0.1}, {"id": 2, "score": 0.9}]}'
    verdict = j.parse_verdict(j.RELATIVE, answer, RUBRIC, group)
    assert {k: s.value for k, s in verdict.scores.items()} == {"ep-b": 0.1, "ep-a": 0.9}
    single = j.parse_verdict(j.ABSOLUTE, '{"score": 1}', RUBRIC, [ep("e")])
    assert single.scores == {"e": j.Score(1.0)}
    assert j.answer_start("a\n  b " + "x" * 300, 10) == "a b xxxxxx..."


# -- groups and keys ---------------------------------------------------------------------------
def test_groups_are_tasks_in_start_order_and_taskless_episodes_stand_alone():
    episodes = [ep("e3", "t2", start=3), ep("e1", "t1", start=1), ep("e2", None, start=2),
                ep("e4", "t1", start=4)]
    groups = j.group_by_task(episodes)
    assert [(g.key, [e.episode for e in g.episodes]) for g in groups] == [
        ("task:t1", ["e1", "e4"]), ("episode:e2", ["e2"]), ("task:t2", ["e3"])]
    assert [u.key for u in j.units_for(j.ABSOLUTE, episodes)] == ["e1", "e2", "e3", "e4"]
    with pytest.raises(ValueError, match="mode must be one of"):
        j.units_for("pairwise", episodes)


def test_max_episodes_never_splits_a_group():
    groups = j.group_by_task([ep("a1", "a", start=1), ep("a2", "a", start=2),
                              ep("b1", "b", start=3), ep("b2", "b", start=4),
                              ep("c1", "c", start=5)])
    assert [u.key for u in j.limit_units(groups, 3)] == ["task:a"]
    assert [u.key for u in j.limit_units(groups, 4)] == ["task:a", "task:b"]
    assert len(j.limit_units(groups, None)) == 3 and j.limit_units(groups, 1) == []


def test_prompt_order_is_fixed_by_the_ids_not_by_the_input_order():
    group = [ep(f"e{i}") for i in range(6)]
    first = [e.episode for e in j.prompt_order(group)]
    assert first == [e.episode for e in j.prompt_order(list(reversed(group)))]
    assert sorted(first) == [f"e{i}" for i in range(6)]


def test_cache_keys_change_with_anything_the_verdict_depends_on():
    group = [ep("a"), ep("b")]
    key = j.cache_key(j.RELATIVE, "judge-m", RUBRIC, group, 1000)
    assert key == j.cache_key(j.RELATIVE, "judge-m", RUBRIC, list(reversed(group)), 1000)
    others = {
        j.cache_key(j.ABSOLUTE, "judge-m", RUBRIC, group, 1000),
        j.cache_key(j.RELATIVE, "judge-big", RUBRIC, group, 1000),
        j.cache_key(j.RELATIVE, "judge-m", j.Rubric("helpful", "other", 0, 1), group, 1000),
        j.cache_key(j.RELATIVE, "judge-m", RUBRIC, [ep("a"), ep("b", blocks=("grew",))], 1000),
        j.cache_key(j.RELATIVE, "judge-m", RUBRIC, group + [ep("c")], 1000),
        j.cache_key(j.RELATIVE, "judge-m", RUBRIC, group, 2000),
    }
    assert key not in others and len(others) == 6
