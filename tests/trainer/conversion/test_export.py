"""``agl-bridge export``: transitions as Hugging Face datasets that TRL's trainers take as they
are. Spans of a team whose messages were captured convert to transitions; the export trains one
step of TRL's SFTTrainer and DPOTrainer on the tiny random model, on CPU."""

import json
import math
import sys

import pytest
from datasets import load_dataset, load_from_disk

from agl_bridge.cli import main
from agl_bridge.trainer.conversion import ConvertConfig, convert
from agl_bridge.trainer.conversion.export import export
from agl_bridge.trainer.conversion.export_config import ExportConfig
from agl_bridge.trainer.rewards.selection import select_for_sft
from tests.factories import llm, reward, table

# two tasks, four episodes each: the solver answers right (reward 1) or wrong (0)
EPISODES = [(task, number, e, answer)
            for task, number in (("t7", 7), ("t9", 9))
            for e, answer in enumerate([str(number), "no", str(number), "maybe"])]


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


@pytest.fixture
def transitions(tmp_path, tokenizer):
    """Transitions converted from spans that hold the ids the server saw and, as at
    AGL_BRIDGE_CAPTURE=messages, the messages."""
    rows = []
    for i, (task, number, e, answer) in enumerate(EPISODES):
        messages = [{"role": "system", "content": "You repeat numbers."},
                    {"role": "user", "content": f"say {number}"}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                               tokenize=True)
        prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
        completion = tokenizer.encode(answer, add_special_tokens=False) + [
            tokenizer.eos_token_id]
        episode = f"{task}-e{e}"
        call = llm(episode, i * 10, task=task, agent="solver", prompt=prompt,
                   completion=completion, trace=f"T{i}")
        call["attributes"] = json.dumps({
            "gen_ai.input.messages": json.dumps(
                [{"role": m["role"], "parts": [{"type": "text", "content": m["content"]}]}
                 for m in messages]),
            "gen_ai.output.messages": json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": answer}],
                  "finish_reason": "stop"}])})
        rows += [call, reward(episode, i * 10 + 5, float(answer == str(number)),
                              trace=f"T{i}")]
    import pyarrow.parquet as pq

    spans = tmp_path / "spans"
    spans.mkdir()
    pq.write_table(table(rows), spans / "part.parquet")
    out = tmp_path / "transitions.parquet"
    assert convert(spans, out, ConvertConfig()).transitions == 8
    return out, spans


def one_step(trainer):
    trainer.train()
    assert trainer.state.global_step == 1
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(math.isfinite(x) for x in losses)


def trl_args(config_class, tmp_path, **extra):
    return config_class(output_dir=str(tmp_path / "trl"), max_steps=1, logging_steps=1,
                        per_device_train_batch_size=2, report_to="none", use_cpu=True,
                        bf16=False, save_strategy="no", **extra)


def test_sft_examples_are_conversational_keep_the_ids_and_train_trl(transitions, tmp_path,
                                                                     tiny, tokenizer):
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    source, spans = transitions
    summary = export(source, tmp_path / "sft", ExportConfig(format="sft", spans=str(spans)))
    assert summary.rows == 4 and summary.conversational  # the best of each group: 2 + 2
    data = load_from_disk(str(tmp_path / "sft"))
    first = data[0]
    assert first["messages"] == [
        {"role": "system", "content": "You repeat numbers."},
        {"role": "user", "content": f"say {first['task_id'][1:]}"},
        {"role": "assistant", "content": first["task_id"][1:]}]
    assert set(data["reward"]) == {1.0} and set(data["agent_name"]) == {"solver"}
    served = tokenizer.apply_chat_template(first["messages"][:2], add_generation_prompt=True,
                                           tokenize=True)
    served = served["input_ids"] if hasattr(served, "keys") else served
    n = len(served)
    assert first["input_ids"][:n] == list(served)  # the ids the server saw, then sampled
    assert first["completion_mask"] == [0] * n + [1] * (len(first["input_ids"]) - n)

    model = AutoModelForCausalLM.from_pretrained(tiny)
    one_step(SFTTrainer(model=model, args=trl_args(SFTConfig, tmp_path), train_dataset=data,
                        processing_class=tokenizer))
    # the conversational form alone trains too (TRL applies the chat template itself)
    messages_only = data.remove_columns(["input_ids", "completion_mask"])
    one_step(SFTTrainer(model=model, args=trl_args(SFTConfig, tmp_path / "m"),
                        train_dataset=messages_only, processing_class=tokenizer))


def test_dpo_pairs_come_from_one_group_and_train_trl(transitions, tmp_path, tiny, tokenizer):
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    source, spans = transitions
    summary = export(source, tmp_path / "dpo", ExportConfig(format="dpo", spans=str(spans)))
    data = load_from_disk(str(tmp_path / "dpo"))
    assert summary.rows == 8 == len(data)  # per task: 2 right x 2 wrong
    for pair in data:
        number = pair["task_id"][1:]
        assert pair["chosen"] == [{"role": "assistant", "content": number}]
        assert pair["rejected"][0]["content"] in ("no", "maybe")
        assert pair["prompt"][-1] == {"role": "user", "content": f"say {number}"}
        assert (pair["score_chosen"], pair["score_rejected"]) == (1.0, 0.0)
        assert pair["chosen_episode_id"].split("-")[0] == pair["rejected_episode_id"].split(
            "-")[0] == pair["task_id"]
        assert pair["chosen_ids"][-1] == pair["rejected_ids"][-1] == tokenizer.eos_token_id
    assert len(set(map(tuple, data["prompt_ids"]))) == 2  # one prompt per group
    model = AutoModelForCausalLM.from_pretrained(tiny)
    one_step(DPOTrainer(model=model, args=trl_args(DPOConfig, tmp_path), train_dataset=data,
                        processing_class=tokenizer))


def test_prompt_completion_rows_keep_rewards_and_ids_as_text_or_ids_only(transitions,
                                                                          tmp_path, tiny):
    source, _ = transitions
    export(source, tmp_path / "pc", ExportConfig(format="prompt-completion", tokenizer=str(tiny),
                                                 file_format=["parquet", "jsonl"]))
    rows = load_dataset("parquet", data_files=str(tmp_path / "pc" / "data.parquet"))["train"]
    jsonl = load_dataset("json", data_files=str(tmp_path / "pc" / "data.jsonl"))["train"]
    assert len(rows) == len(jsonl) == 8
    assert sorted(rows["reward"]) == [0.0] * 4 + [1.0] * 4
    assert all(isinstance(a, float) for a in rows["advantage"])
    first = rows[0]
    assert first["prompt"].endswith("<|im_start|>assistant\n")  # as the server saw it
    assert first["completion"] == "7" and first["completion_ids"][-1] is not None
    assert not (tmp_path / "pc" / "dataset_info.json").exists()  # no arrow asked for
    ids_only = tmp_path / "ids"
    assert main(["export", str(source), "--format", "prompt-completion", "--out",
                 str(ids_only)]) == 0
    plain = load_from_disk(str(ids_only))
    assert "prompt" not in plain.column_names and plain["prompt_ids"] == rows["prompt_ids"]
    assert json.loads((ids_only / "export.settings.json").read_text())["export"]["format"] == \
        "prompt-completion"


def test_sft_selection_is_trainings_and_mistakes_are_named(transitions, tmp_path,
                                                             monkeypatch):
    source, _ = transitions
    import pyarrow.parquet as pq

    converted = pq.read_table(source).to_pylist()
    for how, min_reward in (("best", None), ("best", 2.0), ("threshold", 0.0)):
        picked = select_for_sft([r["reward"] for r in converted],
                                [r["group_id"] for r in converted], how, min_reward)
        expected = sorted(r["episode_id"] for r, k in zip(converted, picked) if k)
        if not expected:
            continue
        export(source, tmp_path / how, ExportConfig(select=how, min_reward=min_reward))
        assert sorted(load_from_disk(str(tmp_path / how))["episode_id"]) == expected
    everything = export(source, tmp_path / "all", ExportConfig(select="all"))
    assert everything.rows == 8 and not everything.conversational
    with pytest.raises(ValueError, match="select = 'threshold' needs min_reward"):
        ExportConfig(select="threshold")
    with pytest.raises(ValueError, match="nothing to export as sft"):
        export(source, tmp_path / "none", ExportConfig(select="threshold", min_reward=2.0))
    assert main(["export", str(tmp_path / "spans"), "--out", str(tmp_path / "x")]) == 2
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ImportError, match=r"pip install 'agl-bridge\[export\]'"):
        export(source, tmp_path / "y")
