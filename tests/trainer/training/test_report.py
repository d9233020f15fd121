"""agl-bridge report: metrics.jsonl -> PNG panels and one self-contained HTML page."""

import base64
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import matplotlib  # noqa: F401  (the train extra; a missing one must fail, not skip)
import pytest

from agl_bridge.trainer.training.report import (
    METADATA_FILE,
    find_adapters,
    load_metrics,
    render,
    summarise,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PANELS = ["loss", "reward", "advantage", "kl", "clip_fraction", "tokens_per_s", "memory",
          "importance_weight", "grad_norm"]
BAD_LINE = 10  # the truncated line's number in the file


def agl(*args):
    exe = Path(sys.executable).with_name("agl-bridge")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True,
                          check=False)


def synthetic_records(n=36):
    """Two adapters interleaved, gradient accumulation 2 (grad_norm NaN on every other
    micro-batch), one infinite KL."""
    out = []
    for i in range(n):
        adapter = "critic" if i % 3 == 2 else "solver"
        out.append({
            "step": (i + 1) // 2, "micro_batch": i, "adapter": adapter,
            "loss": 0.5 - 0.01 * i + (0.2 if adapter == "critic" else 0.0),
            "grad_norm": float("nan") if i % 2 == 0 else 0.3 + 0.01 * i,
            "reward_mean": 0.1 + 0.02 * i, "reward_std": 0.1,
            "advantage_mean": 0.01 * (i % 5 - 2), "advantage_abs_mean": 0.8,
            "tokens": 16.0 + i % 4, "tokens_per_s": 100.0 + 5 * i, "memory_mb": 1000.0 + 10 * i,
            "learning_rate": 1e-4, "skipped_zero_variance": 2,
            "clip_fraction": 0.05 * (i % 3), "ratio_mean": 1.0,
            "kl": float("inf") if i == 20 else 0.001 * i,
            "importance_weight_mean": 1.0 - 0.005 * i,
        })
    return out


@pytest.fixture
def run(tmp_path):
    """A run directory: metrics.jsonl with one truncated line, and two adapter versions."""
    recs = synthetic_records()
    lines = [json.dumps(r) for r in recs]  # json writes NaN / Infinity, as the trainer does
    lines.insert(BAD_LINE - 1, '{"step": 5, "micro_batch": 9, "adapter": "solver", "loss": ')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for name, version, fp in [("solver", 1, "ab" * 32), ("critic", 1, "ab" * 32)]:
        d = run_dir / "adapters" / name / f"v{version:04d}"
        d.mkdir(parents=True)
        (d / METADATA_FILE).write_text(json.dumps({
            "adapter_name": name, "version": version, "base_model": "/models/tiny",
            "base_model_fingerprint": fp, "transitions": 48, "steps": 18,
            "init_adapter": None, "created_unix": 1.7e9}))
    return run_dir, recs


def embedded_summary(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="summary">(.*?)</script>', page, re.DOTALL)
    return json.loads(m.group(1))


def check_pngs(out: Path, names):
    for name in names:
        data = (out / f"{name}.png").read_bytes()
        assert data[:8] == PNG_MAGIC, name
        assert len(data) > 10_000, (name, len(data))  # axes, lines, labels: not a blank canvas


def test_report_functions_plot_both_adapters_and_summarise(run, tmp_path):
    run_dir, recs = run
    metrics = run_dir / "metrics.jsonl"
    records, problems = load_metrics(run_dir)  # the directory works as well as the file
    assert len(records) == len(recs) == 36
    assert len(problems) == 1
    assert problems[0].startswith(f"{metrics}:{BAD_LINE}: not JSON (Expecting value, column")
    assert records[BAD_LINE - 1]["_line"] == BAD_LINE + 1  # lines after it keep their numbers

    # the numbers, computed from what was written, not by the module
    def by(adapter):
        return [r for r in recs if r["adapter"] == adapter]

    tokens = sum(r["tokens"] for r in recs)
    mean_tps = sum(r["tokens_per_s"] for r in recs) / len(recs)
    peak = max(r["memory_mb"] for r in recs)
    # gradient accumulation 2: micro-batches 2k, 2k+1 make step k; it updates both adapters
    # when both had a micro-batch in it
    steps = {a: sum(a in {r["adapter"] for r in recs[k:k + 2]} for k in range(0, 36, 2))
             for a in ("solver", "critic")}
    assert steps == {"solver": 18, "critic": 12}
    final_loss = {a: by(a)[-1]["loss"] for a in ("solver", "critic")}
    mean_reward = {a: sum(r["reward_mean"] for r in by(a)) / len(by(a))
                   for a in ("solver", "critic")}
    finite_kl = [r["kl"] for r in by("critic") if math.isfinite(r["kl"])]
    assert (tokens, mean_tps, peak) == (630.0, 187.5, 1350.0)

    s = summarise(records, problems)
    assert s["micro_batches"] == 36 and s["steps"] == 18 and s["rounds"] == 1
    assert s["tokens"] == tokens and s["mean_tokens_per_s"] == pytest.approx(mean_tps)
    assert s["peak_memory_mb"] == peak and s["malformed"] == 1
    assert s["non_finite"] == {"kl": 1}  # grad_norm's NaNs mean "no step", not bad data
    assert s["skipped_zero_variance"] == 2
    for a in ("solver", "critic"):
        assert s["adapters"][a]["steps"] == steps[a]
        assert s["adapters"][a]["final"]["loss"] == pytest.approx(final_loss[a])
        assert s["adapters"][a]["mean"]["reward_mean"] == pytest.approx(mean_reward[a])
    assert s["adapters"]["critic"]["mean"]["kl"] == pytest.approx(sum(finite_kl) / len(finite_kl))

    adapters, meta_problems = find_adapters(run_dir)
    assert [m["adapter_name"] for m in adapters] == ["critic", "solver"] and not meta_problems
    out = tmp_path / "out"
    page_path = render(records, out, problems=problems, adapters=adapters, source=metrics,
                       run_dir=run_dir)
    assert page_path == out / "report.html"
    check_pngs(out, PANELS)
    assert not (out / "behaviour_gap.png").exists()  # optional panel, no data

    page = page_path.read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == len(PANELS)
    assert {base64.b64decode(i) for i in images} == {(out / f"{p}.png").read_bytes()
                                                     for p in PANELS}
    assert 'src="http' not in page and "<link" not in page  # one file, nothing external
    assert f"{metrics}:{BAD_LINE}" in page
    # the table: totals formatted as the page formats them (thousands separators, 4 digits)
    for cell in ["<td>36</td>", "<td>18</td>", "<td>630</td>", "<td>187.5</td>",
                 "<td>1,350</td>"]:
        assert cell in page, cell
    assert f"{final_loss['critic']:.4g} / " in page
    assert "kl: 1" in page  # the infinite KL, counted
    assert "ababababab" in page and "adapters/solver/v0001" in page  # fingerprint, directory
    assert embedded_summary(page)["adapters"]["solver"]["steps"] == steps["solver"]


def test_cli_report_writes_beside_the_run_and_names_the_bad_line(run):
    run_dir, recs = run
    (run_dir / "adapters" / "broken" / "v0001").mkdir(parents=True)
    (run_dir / "adapters" / "broken" / "v0001" / METADATA_FILE).write_text("{not json")
    out = agl("report", run_dir)
    assert out.returncode == 0, out.stderr
    assert "36 micro-batches, 18 optimizer steps, 2 adapter(s); 1 malformed line(s)" in out.stdout
    assert f"{run_dir / 'metrics.jsonl'}:{BAD_LINE}" in out.stderr
    assert "broken/v0001/agl_bridge_adapter.json: unreadable adapter metadata" in out.stderr
    assert "Traceback" not in out.stderr
    report_dir = run_dir / "report"
    check_pngs(report_dir, PANELS)
    page = (report_dir / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(PANELS)
    assert "unreadable adapter metadata" in page
    assert embedded_summary(page)["tokens"] == sum(r["tokens"] for r in recs)

    other = run_dir.parent / "elsewhere"
    kept = run_dir.parent / "kept" / "judge" / "v0007"
    kept.mkdir(parents=True)
    (kept / METADATA_FILE).write_text(json.dumps({"adapter_name": "judge", "version": 7}))
    out = agl("report", run_dir / "metrics.jsonl", "--out", other,
              "--adapters", kept.parent.parent, "--adapters", run_dir / "adapters")
    assert out.returncode == 0, out.stderr
    assert (other / "loss.png").exists()
    page = (other / "report.html").read_text()
    assert "judge/v0007" in page
    assert page.count("adapters/solver/v0001") == 1  # found twice, listed once
    missing = agl("report", run_dir, "--adapters", run_dir / "nope")
    assert missing.returncode == 2 and str(run_dir / "nope") in missing.stderr


@pytest.mark.parametrize("case", ["missing", "missing_in_dir", "empty", "blank", "all_bad"])
def test_cli_bad_input_is_one_line_naming_the_path(tmp_path, case):
    target = tmp_path / "metrics.jsonl"
    if case == "missing_in_dir":
        target = tmp_path
    elif case == "empty":
        target.write_text("")
    elif case == "blank":
        target.write_text("\n  \n")
    elif case == "all_bad":
        target.write_text("not json\n[1, 2]\n")
    out = agl("report", target)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agl-bridge report: error:"), out.stderr
    assert str(target) in lines[0]
    assert not (tmp_path / "report").exists()


def test_malformed_values_and_a_half_written_last_line(tmp_path):
    good = {"micro_batch": 0, "adapter": "a", "loss": 1.0, "tokens": 3}
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join([
        json.dumps(good),
        json.dumps({**good, "micro_batch": 1, "loss": "high"}),   # 2: not a number
        "\n",                                                     # blank lines are fine
        json.dumps({**good, "micro_batch": 2, "loss": None}),     # 5: null = absent
        '"just a string"',                                        # 6: not an object
        '{"micro_batch": 3, "adapter": "a", "loss": 1' + "0" * 400 + "}",  # 7: too big
        "[" * 100_000,                                            # 8: too deep
        '{"micro_batch": 3, "adapter": "a", "lo',                 # 9: being written
    ]))
    records, problems = load_metrics(path)
    assert [r["_line"] for r in records] == [1, 5] and "loss" not in records[1]
    assert problems[3].startswith(f"{path}:8: not JSON (")  # the text varies with Python
    assert problems[:3] + problems[4:] == [f"{path}:2: loss is not a number ('high')",
                                           f"{path}:6: not a JSON object (str)",
                                           f"{path}:7: loss is out of range",
                                           f"{path}:9: incomplete last line (still being written?)"]
    s = summarise(records, problems)
    assert s["malformed"] == 5 and s["adapters"]["a"]["final"]["loss"] == 1.0


def test_appended_rounds_and_stale_panels(tmp_path):
    """Two rounds appended to one file: micro_batch restarts, the x axis runs on."""
    recs = synthetic_records(6)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs + recs))
    records, problems = load_metrics(path)
    s = summarise(records, problems)
    assert s["rounds"] == 2 and s["micro_batches"] == 12 and s["skipped_zero_variance"] == 4
    out = tmp_path / "out"
    out.mkdir()
    (out / "behaviour_gap.png").write_bytes(PNG_MAGIC)  # from an earlier run's report
    render(records, out)
    assert not (out / "behaviour_gap.png").exists() and (out / "loss.png").exists()


def test_report_on_metrics_from_the_real_trainer(tmp_path):
    from agl_bridge.trainer.models.tiny import build_tiny_model
    from agl_bridge.trainer.training import GRPOConfig, train_policy
    from agl_bridge.trainer.training.report import report
    from tests.factories import transitions

    model = build_tiny_model(tmp_path / "model")
    run_dir = tmp_path / "run"
    data = transitions([1.0, 0.0, 0.5, 0.0, 0.2, 0.9, 0.4, 0.1],
                       groups=["g_a"] * 4 + ["g_b"] * 4, agents=["a"] * 4 + ["b"] * 4)
    cfg = GRPOConfig(learning_rate=1e-2, per_device_train_batch_size=2, num_train_epochs=2,
                     gradient_accumulation_steps=2)
    result = train_policy(data, model, run_dir / "adapters", policy="per_agent_lora", config=cfg,
                          metrics_path=run_dir / "metrics.jsonl", progress=False)

    page, s, problems = report(run_dir)
    assert problems == [] and page == run_dir / "report" / "report.html"
    assert s["micro_batches"] == len(result.metrics) == 8 and s["steps"] == result.steps == 4
    assert set(s["adapters"]) == {"a", "b"}
    assert s["tokens"] == sum(m["tokens"] for m in result.metrics)
    assert s["peak_memory_mb"] == max(m["memory_mb"] for m in result.metrics)
    check_pngs(page.parent, ["loss", "reward", "advantage", "kl", "clip_fraction",
                             "tokens_per_s", "memory", "grad_norm"])
    html = page.read_text()
    for name, d in result.adapters.items():
        meta = json.loads((d / METADATA_FILE).read_text())
        assert f"adapters/{name}/v0001" in html
        assert meta["base_model_fingerprint"][:12] in html


def test_adapter_names_are_data_not_markup(tmp_path):
    name = "_$x^2$ <b>&amp;"  # mathtext, a hidden-legend prefix, HTML
    recs = [{**r, "adapter": name} for r in synthetic_records(4)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    records, problems = load_metrics(path)
    page = render(records, tmp_path / "out", problems=problems).read_text()
    assert "<b>" not in page and "_$x^2$ &lt;b&gt;&amp;amp;" in page
    assert name in embedded_summary(page)["adapters"]
    check_pngs(tmp_path / "out", ["loss"])


def test_a_ppo_run_gets_the_critics_panel_and_a_grpo_run_none(tmp_path):
    lines = [{"step": i + 1, "micro_batch": i, "adapter": "policy", "loss": 0.5 - 0.1 * i,
              "policy_loss": 0.0, "value_loss": 0.5 - 0.1 * i, "value_mean": 0.2 * i,
              "return_mean": 1.0, "value_grad_norm": 0.3} for i in range(4)]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    records, problems = load_metrics(metrics)
    assert not problems
    s = summarise(records, problems)
    assert s["adapters"]["policy"]["final"]["value_loss"] == pytest.approx(0.2)
    assert s["adapters"]["policy"]["mean"]["value_mean"] == pytest.approx(0.3)
    render(records, tmp_path / "out")
    check_pngs(tmp_path / "out", ["critic", "loss"])
    assert "value_loss final / mean" in (tmp_path / "out" / "report.html").read_text()
    grpo = [{k: v for k, v in line.items() if "value" not in k and "return" not in k}
            for line in lines]
    metrics.write_text("".join(json.dumps(line) + "\n" for line in grpo))
    render(load_metrics(metrics)[0], tmp_path / "out")
    assert not (tmp_path / "out" / "critic.png").exists()  # no data: no panel, stale one gone
