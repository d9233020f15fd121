"""The prompt registry (``trainer/serving/prompts.py``): versions published, rolled back and
kept as readable files, every change one transaction under the registry's lock, shared with
the adapter registry; concurrent publishers lose nothing, a kill between the two writes is
reconciled, a damaged file is named."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agl_bridge.prompts import PromptTable
from agl_bridge.trainer.serving.errors import PublishError
from agl_bridge.trainer.serving.prompts import PromptRegistry, parse_version
from agl_bridge.trainer.serving.registry import Registry
from tests.paths import ROOT


def history(reg: Path) -> dict:
    return json.loads((reg / "prompt_history.json").read_text())


def table(reg: Path) -> dict:
    return json.loads((reg / "prompts.json").read_text())["prompts"]


def test_publish_rollback_history_and_files(tmp_path):
    reg = PromptRegistry(tmp_path / "reg")
    v1 = reg.publish("writer", "You write.\nBe brief.\n", note="by hand")
    v2 = reg.publish("writer", "You write.\nBe brief and exact.\n")
    assert (v1.name, v2.name) == ("writer@p1", "writer@p2")
    assert table(tmp_path / "reg") == {"writer": {"version": "writer@p2",
                                                  "text": "You write.\nBe brief and exact.\n"}}
    assert (tmp_path / "reg/prompts/writer/p1.txt").read_text() == "You write.\nBe brief.\n"
    states = [(v["name"], v["state"]) for v in history(tmp_path / "reg")["writer"]]
    assert states == [("writer@p1", "retired"), ("writer@p2", "live")]
    assert history(tmp_path / "reg")["writer"][0]["note"] == "by hand"
    # the same text again publishes nothing
    assert reg.publish("writer", "You write.\nBe brief and exact.\n").name == "writer@p2"
    assert "-Be brief.\n+Be brief and exact.\n" in reg.diff("writer", "p1", 2)

    assert reg.rollback("writer", "p1").name == "writer@p1"
    assert table(tmp_path / "reg")["writer"]["version"] == "writer@p1"
    assert reg.publish("writer", "third").name == "writer@p3"  # numbers count on
    # p0: the agent's own prompt, no text in the table (nothing is swapped)
    assert reg.rollback("writer", "writer@p0").name == "writer@p0"
    assert table(tmp_path / "reg")["writer"] == {"version": "writer@p0"}
    assert reg.text("writer", 0) is None
    reg.record_original("writer", "The program's own prompt.")
    assert reg.text("writer", "p0") == "The program's own prompt."
    assert table(tmp_path / "reg")["writer"] == {"version": "writer@p0"}  # still p0, no text
    assert [v["state"] for v in history(tmp_path / "reg")["writer"]] == \
        ["live", "retired", "retired", "retired"]
    # the agents' reader takes what the registry writes
    assert PromptTable(tmp_path / "reg/prompts.json").live("writer").version == "writer@p0"


def test_refusals_name_the_problem(tmp_path):
    reg = PromptRegistry(tmp_path / "reg")
    with pytest.raises(PublishError, match="empty"):
        reg.publish("writer", "  \n")
    with pytest.raises(PublishError, match="agent name 'a/b' is not usable"):
        reg.publish("a/b", "text")
    with pytest.raises(PublishError, match=r"writer@p7 was never published .*versions of "
                                           r"writer: none"):
        reg.rollback("writer", "p7")
    with pytest.raises(PublishError, match="'v2' is not a prompt version of 'writer'"):
        parse_version("writer", "v2")
    reg.publish("writer", "one")
    (tmp_path / "reg/prompts/writer/p1.txt").write_text("edited in place")
    with pytest.raises(PublishError, match=r"p1\.txt: the text of writer@p1 changed"):
        reg.text("writer", 1)


@pytest.mark.parametrize("content, problem", [
    ("{", "prompts.json: not valid JSON"),
    ('{"prompts": {"writer": {"version": "writer@p1"}}}', "text None is not a non-empty"),
    ('{"prompts": {"writer": {"version": "editor@p1", "text": "x"}}}',
     "version 'editor@p1' is not writer@p<N>"),
    ('[]', "the top level is a list"),
])
def test_a_damaged_table_is_refused_and_nothing_written(tmp_path, content, problem):
    reg = PromptRegistry(tmp_path / "reg")
    (tmp_path / "reg/prompts.json").write_text(content)
    with pytest.raises(PublishError, match=problem):
        reg.publish("writer", "text")
    assert (tmp_path / "reg/prompts.json").read_text() == content
    assert not (tmp_path / "reg/prompt_history.json").exists()


def test_prompts_and_adapters_share_one_lock(tmp_path):
    """A prompt publish waits while an adapter transaction holds the registry's lock."""
    PromptRegistry(tmp_path / "reg").publish("writer", "zero")
    code = textwrap.dedent(f"""
        import sys, time
        from agl_bridge.trainer.serving.registry import Registry
        with Registry({str(tmp_path / 'reg')!r}).transaction():
            print("locked", flush=True)
            time.sleep(1.0)
    """)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    t0 = time.monotonic()
    PromptRegistry(tmp_path / "reg").publish("writer", "one")
    waited = time.monotonic() - t0
    holder.wait(10)
    assert waited > 0.5, waited
    assert Registry(tmp_path / "reg").read_history() == {}  # the adapters' files untouched


PUBLISHER = """
import sys
from pathlib import Path
from agl_bridge.trainer.serving.prompts import PromptRegistry
reg, agent, go, n = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
registry = PromptRegistry(reg)
print("ready", flush=True)
while not go.exists():
    pass
for i in range(n):
    registry.publish(agent, f"{agent} text {i} from {sys.argv[5]}")
"""


def test_concurrent_publishers_lose_nothing(tmp_path):
    reg, go = tmp_path / "reg", tmp_path / "go"
    plan = [("writer", "w1"), ("writer", "w2"), ("reviewer", "r1"), ("reviewer", "r2")]
    procs = [subprocess.Popen([sys.executable, "-c", PUBLISHER, str(reg), agent, str(go), "5",
                               tag], stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for agent, tag in plan]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go.touch()
    assert [p.wait(60) for p in procs] == [0, 0, 0, 0]
    h = history(reg)
    for agent in ("writer", "reviewer"):
        names = [v["name"] for v in h[agent]]
        assert names == [f"{agent}@p{i}" for i in range(1, 11)]
        assert [v["state"] for v in h[agent]].count("live") == 1
        assert table(reg)[agent]["version"] == names[-1]
        texts = {(reg / v["file"]).read_text() for v in h[agent]}
        assert len(texts) == 10


KILLED = """
import os, sys
from agl_bridge.trainer.serving import prompts
from agl_bridge.trainer.serving.prompts import PromptRegistry
real = prompts.replace_text
def replace(path, text):
    if path.name == "prompt_history.json":
        os.kill(os.getpid(), 9)  # killed between the table and the history
    real(path, text)
prompts.replace_text = replace
PromptRegistry(sys.argv[1]).publish("writer", "second")
"""


def test_a_kill_between_table_and_history_is_reconciled(tmp_path):
    reg = PromptRegistry(tmp_path / "reg")
    reg.publish("writer", "first")
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path / "reg")], cwd=ROOT)
    assert proc.returncode == -signal.SIGKILL
    assert table(tmp_path / "reg")["writer"]["version"] == "writer@p2"  # agents switched
    assert [v["name"] for v in history(tmp_path / "reg")["writer"]] == ["writer@p1"]
    # the next transaction follows the table: p2 taken into the history from its file, so
    # its number (which agents and spans have seen) never names another text
    assert reg.publish("writer", "third").name == "writer@p3"
    states = {x["name"]: x["state"] for x in history(tmp_path / "reg")["writer"]}
    assert states == {"writer@p1": "retired", "writer@p2": "retired", "writer@p3": "live"}
    assert reg.text("writer", 2) == "second"
    assert table(tmp_path / "reg")["writer"]["text"] == "third"
    assert os.path.exists(tmp_path / "reg/.registry.lock")
