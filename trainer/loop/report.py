"""Statistics and the HTML page of the demo's loop (``demo.py``, on ``engine.py``).

Success rates get 95% Wilson score intervals (sound at 0% and 100%, unlike the normal
approximation); mean rewards get a normal-approximation interval of the mean. The page is one
self-contained file, made of the pieces of the training report's page (``agl-bridge report``):
plots embedded as PNG data URIs, the numbers in tables beside them.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

from agl_bridge.trainer.loop.apo.versions import key_versions, matches
from agl_bridge.trainer.loop.gate import Z95
from agl_bridge.trainer.training.report import (
    figure,
    img,
    load_metrics,
    new_figure,
    png_bytes,
    render,
    table,
    write_page,
)


def wilson(successes: int, n: int, z: float = Z95) -> dict[str, float]:
    if n == 0:
        return {"rate": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # the rate itself bounds the interval: at 0 or 1, rounding put low a hair above it
    return {"rate": p, "low": min(p, max(0.0, centre - half)),
            "high": max(p, min(1.0, centre + half)), "n": n, "k": successes}


def mean_ci(values: list[float], z: float = Z95) -> dict[str, float]:
    n = len(values)
    if n == 0:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    half = z * sd / math.sqrt(n)
    return {"mean": m, "low": m - half, "high": m + half, "n": n}


def reward_interval(values: list[float]) -> dict[str, float]:
    """Mean reward and its 95% interval: Wilson's when every reward is 0 or 1 (a success rate,
    whose normal interval collapses to a point at 0% and 100%), else :func:`mean_ci`."""
    if values and all(v in (0, 1) for v in values):
        w = wilson(int(sum(values)), len(values))
        return {"mean": w["rate"], "low": w["low"], "high": w["high"], "n": w["n"]}
    return mean_ci(values)


def prompt_versions(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each prompt-version state that served rewarded episodes (the watch's
    ``data["prompt_rewards"]``, in the order first seen), with its episodes, mean reward and
    where it stands: ``live``, ``rolled back`` (a version of it was rolled back), ``replaced``
    (a later publish took its place), or ``mixed`` (episodes that spanned a publish, two
    versions of one agent). Live is the state after the loop's last prompt publish or
    rollback; with none, the states served are the ones live all along."""
    events = [e for e in data.get("events", [])
              if e["event"] in ("prompt published", "prompt rolled back")]
    live: dict[str, str] | None = None
    if events:
        last = events[-1]
        live = ({**last["previous"], **last["versions"]} if last["event"] == "prompt published"
                else dict(last["to"]))
    rolled_back = {v: e["round"] for e in events if e["event"] == "prompt rolled back"
                   for v in e["from"].values()}
    rows = []
    for key, rewards in data.get("prompt_rewards", {}).items():
        carried = key_versions(key)
        back = sorted({rolled_back[v] for v in carried.values() if v in rolled_back})
        status = ("mixed" if len(carried) < len(key.split(",")) else
                  "live" if live is None or matches(carried, live) else
                  f"rolled back (round {back[0]})" if back else "replaced")
        rows.append({"versions": key, "episodes": len(rewards),
                     "reward": reward_interval(rewards), "status": status})
    return rows


def prompt_version_lines(data: dict[str, Any]) -> list[str]:
    """The terminal summary's lines for :func:`prompt_versions` (none when no prompt table
    served the episodes)."""
    rows = prompt_versions(data)
    if not rows:
        return []
    return ["episodes by the prompt versions that served them (mean reward, 95% interval):"] + [
        f"  {r['versions']}: {r['episodes']} episodes, {_mean(r['reward'])}; {r['status']}"
        for r in rows]


def episode_stats(path: str | Path) -> dict[str, Any]:
    """Team success, team reward, and per agent: own reply correct, own reward."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    agents = sorted({a for r in rows for a in r["agent_correct"]})
    return {
        "success": wilson(sum(r["success"] for r in rows), len(rows)),
        "team_reward": mean_ci([r["team_reward"] for r in rows]),
        "agents": {a: wilson(sum(r["agent_correct"].get(a, False) for r in rows), len(rows))
                   for a in agents},
        "agent_reward": {a: mean_ci([r["agent_reward"][a] for r in rows if a in r["agent_reward"]])
                         for a in agents},
    }


# -- plots -------------------------------------------------------------------------------------
def plot_before_after(base: dict, final: dict) -> bytes:
    fig = new_figure()
    ax = fig.add_subplot()
    labels = ["team (final answer)"] + [f"{a} (own reply)" for a in sorted(base["agents"])]
    pairs = [(base["success"], final["success"])] + [
        (base["agents"][a], final["agents"][a]) for a in sorted(base["agents"])]
    xs = range(len(labels))
    for off, idx, name, colour in ((-0.18, 0, "before", "#999999"), (0.18, 1, "after",
                                                                      "#1f77b4")):
        vals = [p[idx]["rate"] * 100 for p in pairs]
        err = [[(p[idx]["rate"] - p[idx]["low"]) * 100 for p in pairs],
               [(p[idx]["high"] - p[idx]["rate"]) * 100 for p in pairs]]
        ax.bar([x + off for x in xs], vals, width=0.36, yerr=err, capsize=4, label=name,
               color=colour)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("held-out correct, % (95% CI)")
    ax.set_title(f"Held-out episodes (n={base['success']['n']}): before vs after training",
                 fontsize=10)
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    return png_bytes(fig)


def plot_rounds(data: dict) -> bytes:
    fig = new_figure()
    ax = fig.add_subplot()
    rounds = [r for r in data["rounds"] if "episodes" in r]
    xs = [r["round"] for r in rounds]
    success = [r["episodes"]["success"] for r in rounds]
    ax.plot(xs, [w["rate"] * 100 for w in success], "o-", color="#1f77b4",
            label="team success (training rollouts)")
    ax.fill_between(xs, [w["low"] * 100 for w in success], [w["high"] * 100 for w in success],
                    color="#1f77b4", alpha=0.15, linewidth=0)
    names = sorted({a for r in rounds for a in r["episodes"]["agents"]})
    for a, colour in zip(names, ("#ff7f0e", "#2ca02c", "#d62728")):
        ax.plot(xs, [r["episodes"]["agents"][a]["rate"] * 100 for r in rounds], "s--",
                color=colour, label=f"{a} own reply correct", markersize=4)
    for label, style in (("baseline", ":"), ("final", "-.")):
        if label in data:
            ax.axhline(data[label]["success"]["rate"] * 100, color="0.4", linestyle=style,
                       label=f"held-out team success, {label}")
    ax.set_xlabel("round (policy that sampled the rollouts: round 0 = base model)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("%")
    ax.set_title(f"Per round: training rollouts at temperature "
                 f"{data['settings']['temperature']}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return png_bytes(fig)


def plot_times(seconds: dict[str, float]) -> bytes:
    fig = new_figure(8.0, 0.5 + 0.45 * len(seconds))
    ax = fig.add_subplot()
    items = sorted(seconds.items(), key=lambda kv: kv[1])
    ax.barh([k for k, _ in items], [v / 60 for _, v in items], color="#1f77b4")
    for i, (_, v) in enumerate(items):
        ax.text(v / 60, i, f" {v:.0f} s", va="center", fontsize=8)
    ax.set_xlabel("minutes")
    ax.set_title(f"Where the time went: {sum(seconds.values()) / 60:.1f} min in all",
                 fontsize=10)
    return png_bytes(fig)


def training_curves(work: Path, data: dict) -> list[tuple[str, bytes]]:
    """The trainer's own panels (``agl-bridge report``) over all rounds' metrics."""
    merged = work / "report" / "metrics-all-rounds.jsonl"
    merged.parent.mkdir(parents=True, exist_ok=True)
    with open(merged, "w") as out:
        for r in data["rounds"]:
            path = Path(r.get("metrics") or "")
            if r.get("metrics") and path.exists():
                out.write(path.read_text())
    if merged.stat().st_size == 0:  # rounds that took no step (no reward variance)
        return []
    records, problems = load_metrics(merged)
    render(records, work / "report" / "training", problems=problems, source=merged)
    return [(png.stem, png.read_bytes())
            for png in sorted((work / "report" / "training").glob("*.png"))]


# -- page --------------------------------------------------------------------------------------
def _pct(w: dict) -> str:
    return f"{w['rate']:.1%} [{w['low']:.1%}, {w['high']:.1%}]"


def _mean(m: dict) -> str:
    return f"{m['mean']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"


def _table(head: list[str], rows: list[list[Any]]) -> str:
    """:func:`table` of plain text: every cell escaped here, once."""
    return table([html.escape(h) for h in head], [[html.escape(str(c)) for c in r] for r in rows])


def _examples(work: Path, n: int = 6) -> str:
    def load(label):
        path = work / label / "results.jsonl"
        if not path.exists():
            return {}
        return {r["task_id"]: r for r in map(json.loads, path.read_text().splitlines())}

    before, after = load("baseline"), load("final")
    agents = list(dict.fromkeys(a for r in before.values() for a in r.get("replies", {})))
    names = " / ".join(agents)
    rows = []
    for tid in list(before)[:n]:
        b, a = before[tid], after.get(tid, {})
        rows.append([b.get("question") or f"{b['a']} + {b['b']}",
                     " / ".join(repr(b["replies"].get(x, "")) for x in agents),
                     "yes" if b["success"] else "no",
                     " / ".join(repr(a.get("replies", {}).get(x, "")) for x in agents),
                     "yes" if a.get("success") else "no"])
    return _table(["task", f"before: {names}", "ok", f"after: {names}", "ok"], rows)


def _gate(record: dict) -> str:
    gate = record.get("gate")
    if record.get("held"):
        return f"held: {record['watch']['reason']}"  # the live version not judged yet
    if not gate:
        return "–"
    if "low" not in gate:
        return gate.get("rule", "")
    verdict = ("refused" if not gate["publish"] else
               f"publish {', '.join(gate['partial'])} only" if gate.get("partial") else "publish")
    return (f"{verdict}: {gate['difference']:+.3f} [{gate['low']:+.3f}, {gate['high']:+.3f}] "
            f"over {gate['n']}")


def _changed(record: dict) -> object:
    """The round's transitions, or for a prompt round (algorithm apo) the candidates tried."""
    if record.get("lever") != "apo":
        return record.get("transitions")
    tried = sum(max(a.get("candidates", 1) - 1, 0) for a in record.get("apo", {}).values())
    return f"APO: {tried} prompt candidate(s)"


def _sampling(settings: dict) -> str:
    t = settings.get("eval_temperature", 0)
    return "greedily" if t == 0 else f"by sampling at temperature {t}"


def write_report(work: Path, data: dict) -> Path:
    base, final = data.get("baseline"), data.get("final")
    s = data.get("demo") or data["settings"]
    body = ["<h1>agl-bridge closed loop: a two-agent AutoGen team learns from its own traces</h1>",
            f"<p class='note'>Model {html.escape(s['model'])}, task {html.escape(s['task'])}; "
            f"{len(data['rounds'])} round(s) of {s['tasks_per_round']} tasks x {s['rollouts']} "
            f"rollouts at temperature {s['temperature']}; {s['convert']['algorithm']} (alpha "
            f"{s['convert']['alpha']}), policy {s['train']['policy']}, learning rate "
            f"{s['train']['learning_rate']}; held-out set of {s['eval_size']} tasks never "
            f"sampled for training, answered "
            f"{_sampling(s)}"
            f" ({s.get('eval_rollouts', 1)} episode(s) per task); resumed "
            f"{data.get('resumed', 0)} time(s); algorithm {s.get('algorithm', 'lora')} "
            f"(what a round changes: lora, the adapters; apo, the prompts).</p>"]
    if base and final:
        diff = (final["success"]["rate"] - base["success"]["rate"]) * 100
        body += [f"<h2>Held-out team success: {base['success']['rate']:.1%} &rarr; "
                 f"{final['success']['rate']:.1%} ({diff:+.1f} points)</h2>",
                 img(plot_before_after(base, final), "held-out success before and after"),
                 _table(["measure (held-out)", "before", "after"],
                        [["team success", _pct(base["success"]), _pct(final["success"])],
                         ["team reward", _mean(base["team_reward"]),
                          _mean(final["team_reward"])]]
                        + [[f"{a}: own reply correct", _pct(base["agents"][a]),
                            _pct(final["agents"][a])] for a in sorted(base["agents"])]
                        + [[f"{a}: own reward", _mean(base["agent_reward"][a]),
                            _mean(final["agent_reward"][a])] for a in sorted(base["agents"])]),
                 "<h3>Some held-out tasks, before and after</h3>", _examples(work)]
    if data["rounds"]:
        body += ["<h2>Per round</h2>", img(plot_rounds(data), "per round"),
                 _table(["round", "episodes", "team success", "team reward", "transitions",
                         "steps", "zero-variance groups", "gate", "published", "seconds"],
                        [[r["round"], r.get("team", {}).get("episodes", "–"),
                          _pct(r["episodes"]["success"]) if "episodes" in r else "–",
                          _mean(r["episodes"]["team_reward"]) if "episodes" in r else "–",
                          _changed(r), r.get("steps"),
                          "–" if r.get("zero_variance_groups") is None  # ppo: none used
                          else r["zero_variance_groups"],
                          _gate(r), ", ".join(r.get("published", {}).values()) or "–",
                          f"{r['seconds']:.0f}"] for r in data["rounds"]])]
        if data.get("served"):
            body += ["<h2>What the service's users saw</h2>",
                     "<p class='note'>Requests answered by the service while each set of "
                     "versions was live (each request seen once, no reward at serving "
                     "time).</p>",
                     _table(["live versions", "requests", "success (95% interval)"],
                            [[", ".join(sorted(set(v["live"].values()))), v["requests"],
                              _pct(v["success"])] for v in data["served"]])]
        events = [e for e in data.get("events", [])
                  if e["event"] not in ("published", "prompt published")]
        if events:
            body += ["<h2>Refusals and rollbacks</h2>",
                     _table(["round", "what", "versions", "why"],
                            [[e["round"], e["event"],
                              json.dumps(e.get("candidate") or e.get("from")), e["reason"]]
                             for e in events])]
        if data.get("prompt_rewards"):
            body += ["<h2>Prompt versions: how their episodes did</h2>",
                     "<p class='note'>Rewarded episodes by the prompt versions their calls "
                     "carried, as the prompt watch keeps them (each state's most recent); the "
                     "95% interval is Wilson's when every reward is 0 or 1.</p>",
                     _table(["prompt versions", "episodes", "mean reward (95% interval)",
                             "now"],
                            [[r["versions"], r["episodes"], _mean(r["reward"]), r["status"]]
                             for r in prompt_versions(data)])]
        curves = training_curves(work, data)
        if curves:
            body.append("<h2>Training curves (one point per micro-batch, all rounds)</h2>")
            body += [figure(png, name, html.escape(name)) for name, png in curves]
    body += ["<h2>Time per stage</h2>", img(plot_times(data["seconds"]), "time per stage")]
    return write_page(work / "report.html", "agl-bridge closed loop", body)
