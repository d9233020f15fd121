import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from tests.factories import llm, reward, table


def agl(*args):
    exe = Path(sys.executable).with_name("agl-bridge")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)


def test_convert_prints_a_summary_and_writes(tmp_path):
    pq.write_table(table([llm("e1", 1), llm("e1", 2, prompt=None), reward("e1", 3, 1.0)]),
                   tmp_path / "spans.parquet")
    out = agl("convert", tmp_path / "spans.parquet", tmp_path / "t.parquet")
    assert out.returncode == 0, out.stderr
    assert "1 episodes, 2 LLM calls -> 1 transitions" in out.stdout
    assert "skipped 1 LLM call(s): no token ids on the LLM span" in out.stdout
    assert pq.read_table(tmp_path / "t.parquet").num_rows == 1
    # what the run used, every setting, beside its output
    import json

    used = json.loads((tmp_path / "t.settings.json").read_text())["convert"]
    assert used["algorithm"] == "at_grpo" and used["baseline"] == ["group", "batch"]
    assert used["missing_reward"] == "drop" and "recipe" not in used


def test_bad_input_is_one_clear_line_not_a_traceback(tmp_path):
    pq.write_table(table([llm("e1", 1)]).drop(["reward_value"]), tmp_path / "bad.parquet")
    out = agl("convert", tmp_path, tmp_path / "t.parquet")
    assert out.returncode == 2
    assert "agl-bridge convert: error:" in out.stderr and "'reward_value'" in out.stderr
    assert "bad.parquet" in out.stderr and "Traceback" not in out.stderr
