"""Each setting declared once (``agl_bridge.settings``): the flags of every command, the keys of
the files and the Python keywords are made from, or checked against, one declaration, so a
setting has one name, one default and one help text whichever door it is reached by."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import subprocess
import sys

import pytest

from agl_bridge import settings
from agl_bridge.cli import build_parser
from agl_bridge.settings import SettingError, build, declared, describe, read_file, resolve
from agl_bridge.trainer.conversion.config import ConvertConfig
from agl_bridge.trainer.judging.config import JudgeConfig
from agl_bridge.trainer.loop.config import LoopConfig
from agl_bridge.trainer.loop.demo_config import DEMO_OVERRIDES, DEMO_SETTINGS, DemoConfig
from agl_bridge.trainer.serving.config import ServeConfig
from agl_bridge.trainer.training.config import GRPOConfig

COMMANDS = ("convert", "train", "judge", "loop", "demo", "serve", "replay")


def declarations(cls: type, prefix: str = "") -> dict[str, tuple[type, dataclasses.Field]]:
    """Dotted path -> (the class that declares it, its field), nested tables walked."""
    out = {}
    for f, tp in declared(cls):
        if settings.is_config(tp):
            out.update(declarations(tp, f"{prefix}{f.name}."))
        elif not f.metadata.get(settings.PYTHON_ONLY):
            out[prefix + f.name] = (cls, f)
    return out


def command_flags(command: str) -> dict[str, argparse.Action]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[command]._actions if a.option_strings}


def test_every_setting_flag_of_every_command_is_its_one_declaration():
    """A flag that sets a setting shows its declaration's help text and default (the demo's
    own values where it declares them) in every command; every declared setting has its flag;
    no command has two declarations behind one name."""
    owners = {"convert": [ConvertConfig], "train": [ConvertConfig, GRPOConfig],
              "judge": [JudgeConfig], "loop": [LoopConfig], "demo": [DemoConfig, LoopConfig],
              "serve": [ServeConfig], "replay": [LoopConfig]}
    reached: dict[tuple[type, str], set[str]] = {}  # declaration -> the flags that set it
    from agl_bridge.commands import REPLAY_OVERRIDES

    overridden = settings.paths_values(DEMO_OVERRIDES)
    own_values = {"demo": overridden, "replay": REPLAY_OVERRIDES}
    for command in COMMANDS:
        decl: dict[str, tuple[type, dataclasses.Field]] = {}
        for cls in owners[command]:
            mine = declarations(cls)
            assert not set(mine) & set(decl), f"{command}: two declarations of " \
                                              f"{sorted(set(mine) & set(decl))}"
            decl.update(mine)
        flags = command_flags(command)
        setting_flags = {d: a for d, a in flags.items() if d in decl}
        for dest, action in setting_flags.items():
            cls, f = decl[dest]
            assert action.help.startswith(f.metadata[settings.HELP]), (command, dest)
            default = own_values.get(command, {}).get(dest, settings.default_of(f))
            if default is not None and not isinstance(default, bool):
                assert action.help.endswith(f"(default: {settings._flag_text(default)})"), \
                    (command, dest, action.help)
            # the flag is the setting's dotted path in its command (a stage's own command
            # takes its settings flat: ``judge --model`` is the loop's ``--judge.model``)
            assert action.option_strings[0] == settings.flag_name(dest), (command, dest)
            reached.setdefault((cls, f.name), set()).add(f"{command} {settings.flag_name(dest)}")
        if command not in ("demo", "replay"):  # those expose the loop settings they take
            assert set(setting_flags) == set(decl), (command, set(decl) - set(setting_flags))
    # the demo's flags are the loop's own (same help), for the settings it exposes
    demo = command_flags("demo")
    assert {"train.learning_rate", "convert.algorithm", "gate.rule", "rounds"} <= set(demo)
    assert "team" not in demo and "server" not in demo  # the demo sets those itself
    assert all(p.split(".")[0] in DEMO_SETTINGS or p in DEMO_SETTINGS for p in overridden)
    # settings reached from several commands: one declaration behind all of their flags
    assert reached[(GRPOConfig, "learning_rate")] == {
        "train --learning-rate", "loop --train.learning-rate", "demo --train.learning-rate"}
    assert reached[(JudgeConfig, "model")] == {"judge --model", "loop --judge.model"}
    assert reached[(LoopConfig, "temperature")] == {"loop --temperature", "demo --temperature",
                                                    "replay --temperature"}
    assert reached[(ServeConfig, "max_lora_rank")] == {"serve --max-lora-rank",
                                                       "loop --serve.max-lora-rank"}
    # publish, rollback and aliases-serve take the registry (and the rank) from the same one
    for command in ("publish", "rollback", "aliases-serve"):
        action = command_flags(command)["registry"]
        assert action.help.startswith(ServeConfig.__dataclass_fields__["registry"].metadata[
            settings.HELP])


def test_names_are_unique_where_they_share_a_door():
    """``agl-bridge train``'s flags and file, and ``train_from_traces``' keywords, hold the
    conversion's and the training's settings side by side: no name may be in both. The
    loop's tables keep each stage's names apart (``judge.temperature`` is not ``temperature``)."""
    assert not {f.name for f in dataclasses.fields(ConvertConfig)} & {
        f.name for f in dataclasses.fields(GRPOConfig)}
    paths = declarations(LoopConfig)
    assert len(paths) == len(set(paths))


def test_python_keywords_are_the_declared_settings_with_their_defaults():
    """``train_from_traces`` takes exactly the two stages' settings as keywords (an unknown one
    is refused, see test_train_from_traces); ``judge_spans`` takes the judge's settings as a
    ``JudgeConfig``, not as keywords of its own."""
    from agl_bridge.trainer.judging.run import judge_spans
    from agl_bridge.trainer.training.from_traces import split_options

    convert, train = split_options({"alpha": 0.5, "learning_rate": 3e-4, "objective": "sft"})
    assert (convert.alpha, train.learning_rate, train.objective) == (0.5, 3e-4, "sft")
    with pytest.raises(SettingError, match=r"unknown setting\(s\) \['learning_rat'\]"):
        split_options({"learning_rat": 1.0})
    keywords = inspect.signature(judge_spans).parameters
    assert keywords["config"].annotation in (JudgeConfig, "JudgeConfig")
    assert set(keywords) & {f.name for f, _ in declared(JudgeConfig)} == {"rubric"}
    from agl_bridge.trainer.serving.vllm_server import VLLMServer

    keywords = inspect.signature(VLLMServer).parameters
    for f, _ in declared(ServeConfig):
        if f.name in keywords:
            assert keywords[f.name].default == settings.default_of(f), f.name
    assert {f.name for f, _ in declared(ServeConfig)} - set(keywords) == {
        "registry", "tool_call_parser", "vllm_args"}  # the last two: extra_args()


def test_what_a_run_records_reads_back_as_the_same_configuration():
    cfg = build(LoopConfig, {"model": "m", "agents": ["a"], "train": {"lora_r": 4},
                             "convert": {"baseline": "group,batch",
                                         "evaluation_weights": {"thumbs": 2}}})
    again = build(LoopConfig, cfg.settings())
    assert again == cfg and again.convert.evaluation_weights == {"thumbs": 2.0}


@pytest.mark.parametrize("text, problem", [
    ('learning_rate = "fast"', "learning_rate = 'fast': expected a number"),
    ("lora_r = 2.5", "lora_r = 2.5: expected an integer"),
    ('loss_type = "sum"', "loss_type = 'sum': expected one of 'grpo', 'bnpo', 'dapo', "
                          "'dr_grpo'"),
    ("bf16 = 1", "bf16 = 1: expected true or false or none"),
    ("lora_target_modules = [1]", r"lora_target_modules = \[1\]: expected a list of a string"),
    ("learnin_rate = 1", "unknown setting learnin_rate"),
    ("learning_rate = ", "not valid TOML"),
    ("[train]\nlr = 1", "unknown setting train"),  # training's file is flat: no tables
])
def test_a_bad_file_names_the_file_the_key_and_what_is_allowed(tmp_path, text, problem):
    path = tmp_path / "train.toml"
    path.write_text(text + "\n")
    with pytest.raises(SettingError, match=f"{path}: {problem}"):
        build(GRPOConfig, read_file(path), str(path))


def test_files_that_are_not_settings_are_refused_by_name(tmp_path):
    for name, content in (("a.yaml", "x: 1"), ("b.json", "[1, 2]"), ("c.json", "{")):
        (tmp_path / name).write_text(content)
        with pytest.raises(SettingError, match=str(tmp_path / name)):
            read_file(tmp_path / name)
    (tmp_path / "d.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SettingError, match=r"d\.toml: not text"):
        read_file(tmp_path / "d.toml")
    with pytest.raises(SettingError, match="cannot read it"):
        read_file(tmp_path / "absent.toml")
    link = tmp_path / "dir.toml"
    link.mkdir()
    with pytest.raises(SettingError, match=r"dir\.toml: cannot read it"):
        read_file(link)
    import os

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # nobody writes: reading it would block forever
    with pytest.raises(SettingError, match=r"fifo\.toml: cannot read it \(not a regular file"):
        read_file(fifo)
    # recipes and rubrics are read the same way
    from agl_bridge.trainer.judging.run import load_rubric
    from agl_bridge.trainer.rewards.recipes import RecipeError, load_recipe

    with pytest.raises(RecipeError, match=r"recipe .*fifo\.toml: cannot read it \(not a regular"):
        load_recipe(fifo)
    with pytest.raises(ValueError, match=r"rubric .*fifo\.toml: cannot read it \(not a regular"):
        load_rubric(fifo)
    zero = tmp_path / "zero.toml"
    zero.symlink_to("/dev/zero")  # would never end
    with pytest.raises(SettingError, match="not a regular file"):
        read_file(zero)
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(SettingError, match="a file read here is at most 1048576"):
        read_file(big)
    target = tmp_path / "real.toml"
    target.write_text("lora_r = 4\n")
    (tmp_path / "link.toml").symlink_to(target)  # a link to a regular file reads as the file
    assert read_file(tmp_path / "link.toml") == {"lora_r": 4}


def test_where_each_value_came_from_is_shown():
    cfg, origin = resolve(LoopConfig, layers=[("demo", {"rounds": 3}),
                                              ("file loop.toml", {"train": {"lora_r": 4}}),
                                              ("flag", {"rounds": 5})])
    text = describe(cfg, origin)
    assert next(ln for ln in text.splitlines() if ln.startswith("rounds ")).endswith("# flag")
    assert next(ln for ln in text.splitlines() if ln.startswith("lora_r ")).endswith(
        "# file loop.toml")
    assert next(ln for ln in text.splitlines() if ln.startswith("learning_rate ")).endswith(
        "# default")
    assert "[train]" in text and "[convert]" in text and cfg.rounds == 5


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agl_bridge.cli", *args], capture_output=True,
                          text=True, timeout=120)


def test_print_config_shows_file_flag_and_demo_values(tmp_path):
    config = tmp_path / "loop.toml"
    config.write_text('model = "m"\n[train]\nlearning_rate = 3e-4\n')
    out = run_cli("loop", "--config", str(config), "--train.lora-r", "4", "--print-config")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(ln.startswith("learning_rate = 0.0003") and ln.endswith(f"# file {config}")
               for ln in lines)
    assert any(ln.startswith("lora_r = 4") and ln.endswith("# flag") for ln in lines)
    demo = run_cli("demo", "--print-config", "--rounds", "2")
    assert demo.returncode == 0, demo.stderr
    assert any(ln.startswith("learning_rate = 0.0002") and ln.endswith("# demo")
               for ln in demo.stdout.splitlines())
    assert any(ln.startswith("rounds = 2") and ln.endswith("# flag")
               for ln in demo.stdout.splitlines())
    bad = run_cli("loop", "--config", str(config), "--print-config", "--train.lora-r", "x")
    assert bad.returncode == 2 and "--train.lora-r: 'x': expected an integer" in bad.stderr
    config.write_text('model = "m"\n[train]\nlearning_rate = "x"\n')
    bad = run_cli("train", "traces", "--base-model", "m", "--config", str(config))
    assert bad.returncode == 2 and "unknown setting(s) ['model', 'train']" in bad.stderr
    bad = run_cli("loop", "--config", str(config), "--print-config")
    assert bad.returncode == 2
    assert f"{config}: train.learning_rate = 'x': expected a number" in bad.stderr


def test_the_massgen_demo_serves_tool_calls_and_a_flag_still_wins():
    """``demo --task massgen`` serves MassGen's workflow tool calls (the hermes parser and the
    chat template the package ships, with room for MassGen's prompts) and answers in 96 tokens;
    a flag still wins over the demo's value."""
    from agl_bridge.trainer.loop.teams.massgen_arith import CHAT_TEMPLATE, RECIPE

    assert CHAT_TEMPLATE.is_file() and "[terms.votes]" in RECIPE.replace('"', "")
    demo = run_cli("demo", "--task", "massgen", "--print-config")
    assert demo.returncode == 0, demo.stderr
    lines = demo.stdout.splitlines()
    for want in ('tool_call_parser = "hermes"', "max_model_len = 4096", "max_tokens = 96",
                 f'vllm_args = ["--chat-template", "{CHAT_TEMPLATE}"]'):
        assert any(ln.startswith(want) and ln.endswith("# demo") for ln in lines), want
    flagged = run_cli("demo", "--task", "massgen", "--max-tokens", "64", "--print-config")
    assert any(ln.startswith("max_tokens = 64") and ln.endswith("# flag")
               for ln in flagged.stdout.splitlines())


def test_the_cli_parser_builds_without_torch_pyarrow_or_the_demo():
    code = ("import sys; from agl_bridge.cli import build_parser; build_parser(); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'pyarrow', "
            "'transformers', 'vllm') or m == 'agl_bridge.trainer.loop.demo']; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_cli_docstring_and_docs_name_every_command():
    from pathlib import Path

    import agl_bridge.cli as cli

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    docs = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    for command in sub.choices:
        assert f"agl-bridge {command}" in cli.__doc__, command
        assert f"agl-bridge {command}" in docs, command


def test_what_follows_a_double_dash_reaches_vllm_as_its_own_flags():
    """Issue 29.2: ``serve`` (and the loop's and demo's servers) pass vLLM flags through, and a
    tool-calling preset adds the two flags vLLM wants for ``tool_choice="auto"``."""
    out = run_cli("serve", "--model", "m", "--tool-call-parser", "hermes", "--print-config",
                  "--", "--enable-prefix-caching", "--max-num-seqs", "8")
    assert out.returncode == 0, out.stderr
    assert 'vllm_args = ["--enable-prefix-caching", "--max-num-seqs", "8"]' in out.stdout
    assert "max_model_len # unset" in out.stdout  # the model's own limit
    for command in ("loop", "demo"):
        out = run_cli(command, "--print-config", "--", "--enforce-eager")
        assert out.returncode == 0, out.stderr
        assert 'vllm_args = ["--enforce-eager"]' in out.stdout and "# flag" in out.stdout
    bad = run_cli("convert", "a", "b", "--", "--enforce-eager")
    assert bad.returncode == 2 and "convert starts no vLLM" in bad.stderr
    cfg = build(ServeConfig, {"tool_call_parser": "hermes", "vllm_args": ["--seed", "1"]})
    assert cfg.extra_args() == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                "--seed", "1"]
    assert ServeConfig().extra_args() == []
