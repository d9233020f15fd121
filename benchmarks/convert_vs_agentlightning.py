"""Spans -> RL transitions: our converter next to Agent Lightning 0.3.0's ``TracerTraceToTriplet``,
on the same synthetic multi-agent span set of a million spans, in one run.

Why: the converter turns production traces into training data, so it must keep up with them
(issue 5: at least 20x the peer's speed, and peak memory flat when the input grows 10x), and it
must read the same token ids out of the spans as the reference implementation does.

What runs (every measurement in its own fresh subprocess; imports are not timed):

1. Input: ``convert_synthetic.py`` generates N episodes (default: the smallest N with at least
   1,000,000 spans; ``--quick``: 50,000 spans) from a seed, once, cached under
   ``.cache/convert-bench/<N>/seed-<S>/``: ``ours/`` (span Parquet, as capture writes it) and
   ``peer/`` (Agent Lightning ``Span`` objects, pickled per 500 episodes). Also ours at N/10.
2. ``ours``: ``agl_bridge.trainer.conversion.convert(<Parquet dir>, <temp file>)`` with its
   defaults, at N/10 and at N: wall seconds, spans/s, peak RSS (``ru_maxrss``) and the RSS after
   imports. Whatever ``convert`` does today is what is measured.
3. ``peer``: in ``.cache/venv-agentlightning`` (created on first run: ``agentlightning==0.3.0``;
   ``LITELLM_LOCAL_MODEL_COST_MAP=True`` for every process that imports it, or its import reaches
   for the network), ``TracerTraceToTriplet().adapt(spans)`` once per episode, as its training
   daemon calls it per rollout, given its own ``Span`` objects (its faster input; raw
   ``ReadableSpan``s cost it about 3x more). Timed two ways: adapt() alone (the peer's best
   case) and unpickling + adapt() (the nearest to ours, which includes reading Parquet and
   writing the transitions file). Its peak RSS depends on the 500-episode chunks we feed it.
4. ``peer, once on many episodes``: ``adapt()`` called once on the first E episodes together
   (its hierarchy repair is O(episodes x spans)); sizes grow until one would take more than
   about 5 minutes, and the time at N episodes is extrapolated, not run. Reported with how many
   rewards land on another episode's call (its reward matching is by time across the input).
5. Check: for every LLM call both produce, prompt and completion ids must be identical. Ours is
   keyed by span id, theirs by ``gen_ai.response.id`` (``chatcmpl-<span id>``). Where ours
   merges an agent's tool call and its follow-up into one transition (the follow-up's prompt
   extends the context), it must equal theirs piecewise: our prompt = the first call's prompt,
   the trained (mask 1) runs of our completion = each call's completion, and prompt +
   completion = the last call's prompt + completion. Ids are compared by BLAKE2b digests of
   their int32 bytes. Agent names and the rewards the peer assigns are compared too (its reward
   lands on the last call of an episode only; ours on every transition).

Timings come from a shared 2-core machine where other work may run: each configuration runs
``--repeats`` times, interleaved, and medians are printed with the min..max spread.

Run: ``.venv/bin/python benchmarks/convert_vs_agentlightning.py [--quick] [--repeats R]
[--json PATH]``. The first run creates the peer venv (about 1.5 minutes) and the input (about
10 minutes for the full size; ``--quick``: under a minute); later runs reuse both.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
import convert_synthetic as syn  # noqa: E402 - stdlib-only at import: runs in both venvs

PEER_VENV = REPO / ".cache" / "venv-agentlightning"
PEER_SPEC = "agentlightning==0.3.0"
CACHE = REPO / ".cache" / "convert-bench"
FULL_SPANS, QUICK_SPANS = 1_000_000, 50_000
ONCE_SIZES_FULL, ONCE_SIZES_QUICK = (100, 300, 1000), (50, 150)
ONCE_BUDGET_S = 300  # a peer-once size predicted to take longer is not run
DIGEST = 12


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGL_BRIDGE_", "OTEL_"))}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return env


def _digest(ids: Any) -> str:
    """BLAKE2b of the ids as little-endian int32 (a list, or a numpy int32 array)."""
    raw = ids.tobytes() if hasattr(ids, "tobytes") else array("i", ids).tobytes()
    return hashlib.blake2b(raw, digest_size=DIGEST).hexdigest()


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _cpu_s() -> float:
    """CPU seconds of this process, every thread (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _maxrss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


# =============================================================================================
# workers: each runs in a fresh process (ours: dev venv; peer: Agent Lightning's venv)
# =============================================================================================
def worker_ours(src: str, out: str) -> dict[str, Any]:
    from agl_bridge.trainer.conversion import convert

    rss0 = _rss_kb()
    c0 = _cpu_s()
    t0 = time.perf_counter()
    stats = convert(src, out)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "cpu_s": _cpu_s() - c0, "maxrss_kb": _maxrss_kb(),
            "rss_after_import_kb": rss0,
            "transitions": stats.transitions, "spans": getattr(stats, "spans", None),
            "llm_spans": getattr(stats, "llm_spans", None),
            "summary": stats.summary().splitlines()[0] if hasattr(stats, "summary") else ""}


def _peer_imports():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import pickle

    import agentlightning
    import agentlightning.types  # for unpickling Span
    from agentlightning.adapter.triplet import TracerTraceToTriplet

    return pickle, TracerTraceToTriplet, getattr(agentlightning, "__version__", "?")


def worker_peer(src: str, records: str) -> dict[str, Any]:
    """adapt() per episode over every chunk; one record line per triplet (written untimed)."""
    pickle, Adapter, version = _peer_imports()
    rss0 = _rss_kb()
    adapter = Adapter()
    load_s = adapt_s = load_cpu = adapt_cpu = 0.0
    spans = episodes = triplets = 0
    with open(records, "w") as out:
        for path in sorted(Path(src).glob("chunk-*.pkl")):
            t0, c0 = time.perf_counter(), _cpu_s()
            with open(path, "rb") as f:
                chunk = pickle.load(f)
            load_s += time.perf_counter() - t0
            load_cpu += _cpu_s() - c0
            for ep, ep_spans in chunk:
                t0, c0 = time.perf_counter(), _cpu_s()
                result = adapter.adapt(ep_spans)
                adapt_s += time.perf_counter() - t0
                adapt_cpu += _cpu_s() - c0
                spans += len(ep_spans)
                episodes += 1
                triplets += len(result)
                turn = {s.attributes.get("gen_ai.response.id"): s.attributes.get(
                    "agl_bridge.turn.index") for s in ep_spans if s.name == syn.PEER_LLM_SPAN}
                for k, tr in enumerate(result):
                    p, c = tr.prompt.get("token_ids") or [], tr.response.get("token_ids") or []
                    rid = tr.metadata.get("response_id")
                    out.write("\t".join(map(str, (
                        ep, k, rid, tr.metadata.get("agent_name"), turn.get(rid),
                        "" if tr.reward is None else repr(tr.reward), len(p), len(c),
                        _digest(p), _digest(c), _digest(list(p) + list(c)),
                        ",".join(map(str, p[:6])), ",".join(map(str, c[:6]))))) + "\n")
            del chunk
    return {"adapt_s": adapt_s, "load_s": load_s, "wall_s": adapt_s + load_s,
            "adapt_cpu_s": adapt_cpu, "cpu_s": adapt_cpu + load_cpu, "spans": spans,
            "episodes": episodes, "triplets": triplets, "maxrss_kb": _maxrss_kb(),
            "rss_after_import_kb": rss0, "version": version}


def worker_peer_once(src: str, n_episodes: int) -> dict[str, Any]:
    """adapt() once on the first n episodes together, then per episode for reference."""
    pickle, Adapter, _ = _peer_imports()
    eps: list = []
    for path in sorted(Path(src).glob("chunk-*.pkl")):
        with open(path, "rb") as f:
            eps += pickle.load(f)
        if len(eps) >= n_episodes:
            break
    eps = eps[:n_episodes]
    spans = [s for _, ep_spans in eps for s in ep_spans]
    episode_of, reward_of = {}, {}
    for ep, ep_spans in eps:
        for s in ep_spans:
            if s.name == syn.PEER_LLM_SPAN:
                episode_of[s.attributes["gen_ai.response.id"]] = ep
            elif s.name == syn.PEER_REWARD_SPAN:
                reward_of[ep] = s.attributes["agentlightning.reward.0.value"]
    t0 = time.perf_counter()
    once = Adapter().adapt(spans)
    once_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    per_episode = [tr for _, ep_spans in eps for tr in Adapter().adapt(ep_spans)]
    per_s = time.perf_counter() - t0
    rewarded = [tr for tr in once if tr.reward is not None]
    wrong = sum(tr.reward != reward_of[episode_of[tr.metadata["response_id"]]] for tr in rewarded)
    got = {episode_of[tr.metadata["response_id"]] for tr in rewarded
           if tr.reward == reward_of[episode_of[tr.metadata["response_id"]]]}
    return {"episodes": len(eps), "spans": len(spans), "once_s": once_s, "per_episode_s": per_s,
            "triplets_once": len(once), "triplets_per_episode": len(per_episode),
            "rewarded_calls": len(rewarded), "reward_from_other_episode": wrong,
            "episodes_without_own_reward": len(eps) - len(got)}


def _worker_main(argv: list[str]) -> int:
    kind, args = argv[0], argv[1:]
    if kind == "ours":
        result = worker_ours(args[0], args[1])
    elif kind == "peer":
        result = worker_peer(args[0], args[1])
    elif kind == "peer-once":
        result = worker_peer_once(args[0], int(args[1]))
    else:
        raise SystemExit(f"unknown worker {kind}")
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# =============================================================================================
# driver: dev venv
# =============================================================================================
def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ensure_peer_venv() -> Path:
    python = PEER_VENV / "bin" / "python"
    probe = ["-c", ("import agentlightning, importlib.metadata as m; "
                    "print(m.version('agentlightning'))")]
    if python.exists():
        r = subprocess.run([str(python), *probe], check=False, capture_output=True, text=True,
                           env=_env())
        if r.returncode == 0 and r.stdout.strip() == PEER_SPEC.split("==")[1]:
            return python
        log(f"{PEER_VENV} is not usable ({(r.stderr or r.stdout).strip()[-200:]}): recreating")
        shutil.rmtree(PEER_VENV)
    log(f"creating {PEER_VENV} with {PEER_SPEC} (about 1.5 minutes, ~130 packages) ...")
    for cmd in ([sys.executable, "-m", "venv", str(PEER_VENV)],
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 PEER_SPEC]):
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=_env())
        if r.returncode != 0:
            raise SystemExit(f"`{' '.join(cmd[2:])}` failed (rc {r.returncode}): "
                             f"{(r.stderr or r.stdout).strip()[-800:]}")
    r = subprocess.run([str(python), *probe], check=False, capture_output=True, text=True,
                       env=_env())
    if r.returncode != 0:
        raise SystemExit(f"{PEER_SPEC} installed but not importable: {r.stderr.strip()[-500:]}")
    return python


def dataset(n: int, seed: int, fmt: str) -> Path:
    return CACHE / str(n) / f"seed-{seed}" / fmt


def _complete(path: Path) -> dict[str, Any] | None:
    try:
        m = json.loads((path / "_manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if m.get("format_version") != syn.FORMAT_VERSION:
        return None
    return m if m.get("writer") == syn.writer_fingerprint(m.get("format")) else None


def ensure_datasets(wanted: list[tuple[int, str]], seed: int, peer_python: Path
                    ) -> dict[tuple[int, str], dict[str, Any]]:
    """Generate missing inputs (in parallel: one process per format and size)."""
    procs = []
    for n, fmt in wanted:
        path = dataset(n, seed, fmt)
        if _complete(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        python = sys.executable if fmt == "ours" else str(peer_python)
        log(f"generating {n} episodes ({fmt}) into {path.relative_to(REPO)} ...")
        cmd = [python, str(HERE.parent / "convert_synthetic.py"), "--episodes", str(n),
               "--seed", str(seed), "--format", fmt, "--out", str(path)]
        procs.append((path, subprocess.Popen(cmd, env=_env(), cwd=REPO,
                                             stdout=subprocess.DEVNULL)))
    for path, p in procs:
        if p.wait() != 0:
            raise SystemExit(f"generating {path} failed (rc {p.returncode})")
    return {(n, fmt): _complete(dataset(n, seed, fmt)) for n, fmt in wanted}


def _cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat; None elsewhere than Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def run_worker(python: str | Path, args: list[str], timeout: float = 3600) -> dict[str, Any]:
    """One measurement in a fresh process. Adds ``steal_pct``: the share of the machine's CPU
    time its hypervisor gave to other guests meanwhile (on a shared host it varies from run
    to run, and slows a two-thread pipeline more than a one-thread loop)."""
    cmd = [str(python), str(HERE), "--worker", *map(str, args)]
    t0 = _cpu_ticks()
    try:
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=_env(),
                           cwd=REPO, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    t1 = _cpu_ticks()
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-3:]
        return {"error": f"rc {r.returncode}: {' | '.join(tail)}"}
    res = json.loads(lines[-1][len("RESULT "):])
    if t0 and t1 and t1[1] > t0[1]:
        res["steal_pct"] = 100.0 * (t1[0] - t0[0]) / (t1[1] - t0[1])
    return res


# -- the id check -------------------------------------------------------------------------------
def _runs(mask) -> list[tuple[int, int]]:
    """[start, end) of the runs of 1 in a 0/1 numpy array."""
    import numpy as np

    m = np.concatenate(([0], (mask == 1).astype(np.int8), [0]))
    d = np.diff(m)
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist()))


def compare(transitions: Path, records: Path, max_listed: int = 5) -> dict[str, Any]:
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    peer: dict[str, tuple] = {}
    by_turn: dict[tuple, list[tuple]] = {}
    with open(records) as f:
        for line in f:
            (ep, k, rid, agent, turn, reward, plen, clen, dp, dc, dpc, ph, ch) = \
                line.rstrip("\n").split("\t")
            rec = (ep, int(k), rid, agent, turn, float(reward) if reward else None, int(plen),
                   int(clen), dp, dc, dpc, ph, ch)
            peer[rid] = rec
            by_turn.setdefault((ep, agent, turn), []).append(rec)
    for recs in by_turn.values():
        recs.sort(key=lambda r: r[1])

    res = {"peer_calls": len(peer), "ours_transitions": 0, "ours_calls": 0,
           "single_matched": 0, "single_mismatched": 0, "merged_transitions": 0,
           "merged_calls": 0, "merged_matched": 0, "merged_mismatched": 0,
           "not_in_peer": 0, "agent_name_equal": 0, "agent_name_differs": 0,
           "peer_rewarded_calls": sum(r[5] is not None for r in peer.values()),
           "peer_reward_equal_ours": 0, "mismatches": []}
    seen: set[str] = set()

    def miss(kind: str, span_id: str, detail: str) -> None:
        if len(res["mismatches"]) < max_listed:
            res["mismatches"].append(f"{kind} span {span_id}: {detail}")

    pf = pq.ParquetFile(transitions)
    cols = [c for c in ("episode_id", "agent_name", "turn_index", "span_id", "merged_calls",
                        "prompt_ids", "completion_ids", "completion_mask", "reward")
            if c in pf.schema_arrow.names]
    for batch in pf.iter_batches(batch_size=8192, columns=cols):
        d = {c: batch.column(c) for c in cols}

        def flat(name, d=d):
            arr = d[name]
            lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy()
            ends = np.cumsum(lengths)
            return arr.flatten().to_numpy(zero_copy_only=False), ends - lengths, ends

        pv, ps, pe = flat("prompt_ids")
        cv, cs, ce = flat("completion_ids")
        mv, ms, me = flat("completion_mask")
        pv, cv = pv.astype("<i4"), cv.astype("<i4")
        span_ids = d["span_id"].to_pylist()
        agents = d["agent_name"].to_pylist()
        rewards = d["reward"].to_pylist()
        for i, sid in enumerate(span_ids):
            res["ours_transitions"] += 1
            prompt, completion = pv[ps[i]:pe[i]], cv[cs[i]:ce[i]]
            runs = _runs(mv[ms[i]:me[i]])
            rid = syn.response_id(sid)
            first = peer.get(rid)
            if first is None:
                res["not_in_peer"] += 1
                miss("not in peer:", sid, f"prompt {prompt[:6].tolist()}...")
                continue
            if len(runs) == 1 and runs[0] == (0, len(completion)):
                calls = [first]
            else:  # merged: the turn's calls from the first one on, one per trained run
                turn_recs = by_turn[(first[0], first[3], first[4])]
                k0 = next(j for j, r in enumerate(turn_recs) if r[2] == rid)
                calls = turn_recs[k0:k0 + len(runs)]
            res["ours_calls"] += len(calls)
            for r in calls:
                seen.add(r[2])
                if r[3] == agents[i]:
                    res["agent_name_equal"] += 1
                else:
                    res["agent_name_differs"] += 1
                if r[5] is not None and r[5] == rewards[i]:
                    res["peer_reward_equal_ours"] += 1
            if len(calls) == 1:
                ok = (_digest(prompt) == first[8] and _digest(completion) == first[9])
                res["single_matched" if ok else "single_mismatched"] += 1
                if not ok:
                    miss("call", sid, f"ours prompt[{len(prompt)}] {prompt[:6].tolist()} "
                         f"completion[{len(completion)}] {completion[:6].tolist()}; peer "
                         f"prompt[{first[6]}] [{first[11]}] completion[{first[7]}] [{first[12]}]")
                continue
            res["merged_transitions"] += 1
            res["merged_calls"] += len(calls)
            ok = (len(calls) == len(runs) and _digest(prompt) == first[8]
                  and all(_digest(completion[a:b]) == r[9] for (a, b), r in zip(runs, calls))
                  and _digest(np.concatenate((prompt, completion))) == calls[-1][10])
            res["merged_matched" if ok else "merged_mismatched"] += 1
            if not ok:
                miss("merged turn", sid, f"{len(runs)} trained runs vs {len(calls)} peer calls; "
                     f"ours prompt[{len(prompt)}] completion[{len(completion)}]; peer prompts "
                     f"{[r[6] for r in calls]} completions {[r[7] for r in calls]}")
    res["peer_calls_not_in_ours"] = len(peer) - len(seen)
    for rid in (r for r in peer if r not in seen):
        if len(res["mismatches"]) >= max_listed:
            break
        res["mismatches"].append(f"peer call {rid} (episode {peer[rid][0]}) not in ours")
    return res


# -- report -------------------------------------------------------------------------------------
def once_fit(done: list[dict[str, Any]]) -> tuple[float, float]:
    """(a, b) of t = a*E + b*E^2 through the two largest peer-once sizes (b >= 0; one size:
    pure quadratic). Its hierarchy repair and reward matching are both O(E^2) at large E."""
    if len(done) == 1 or done[-1]["episodes"] == done[-2]["episodes"]:
        e, t = done[-1]["episodes"], done[-1]["once_s"]
        return 0.0, t / e**2
    (e1, t1), (e2, t2) = [(r["episodes"], r["once_s"]) for r in done[-2:]]
    b = (t2 / e2 - t1 / e1) / (e2 - e1)
    if b <= 0:
        return t2 / e2, 0.0
    return t2 / e2 - b * e2, b


def _once_time(fit: tuple[float, float], e: int) -> float:
    return fit[0] * e + fit[1] * e * e


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    if not xs:
        return "-"
    s = fmt.format(_med(xs))
    return s + (f" ({fmt.format(min(xs))}..{fmt.format(max(xs))})" if len(xs) > 1 else "")


def _machine() -> dict[str, Any]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(mem, 1),
            "python": platform.python_version(), "load_avg_start": os.getloadavg()}


def _git() -> dict[str, Any]:
    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], check=False, capture_output=True, text=True, cwd=REPO)
        return r.stdout.strip()

    conv = REPO / "trainer" / "conversion" / "engine.py"
    fast = REPO / "trainer" / "conversion" / "stages.py"
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "transitions_py_modified": bool(git("status", "--porcelain", str(conv), str(fast))),
            "transitions_py_sha256": hashlib.sha256(conv.read_bytes()).hexdigest()[:12],
            "columnar_py_sha256": (hashlib.sha256(fast.read_bytes()).hexdigest()[:12]
                                   if fast.exists() else "-")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"~{QUICK_SPANS:,} spans")
    ap.add_argument("--episodes", type=int, help="override N (episodes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-once", action="store_true", help="skip the peer-once runs")
    ap.add_argument("--json", type=Path, help="write every figure here too")
    ap.add_argument("--report", type=Path, metavar="JSON", help="print the report of a --json "
                    "file again (no measuring)")
    a = ap.parse_args(argv)
    if a.report:
        report(json.loads(a.report.read_text()))
        return 0

    target = QUICK_SPANS if a.quick else FULL_SPANS
    n = a.episodes or syn.episodes_for_spans(target, a.seed)
    n10 = max(1, n // 10)
    info = {"date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": _machine(), "git": _git(), "seed": a.seed, "episodes": n,
            "repeats": a.repeats}
    log(f"N = {n} episodes (N/10 = {n10}), seed {a.seed}; machine {info['machine']}")
    peer_python = ensure_peer_venv()
    t0 = time.perf_counter()
    manifests = ensure_datasets([(n, "ours"), (n10, "ours"), (n, "peer")], a.seed, peer_python)
    info["inputs"] = {f"{k[1]}@{k[0]}": v for k, v in manifests.items()}
    log(f"inputs ready ({time.perf_counter() - t0:.0f} s): "
        + ", ".join(f"{k}: {v['spans']:,} spans" for k, v in info["inputs"].items()))
    assert manifests[(n, "peer")]["spans"] == manifests[(n, "ours")]["spans"], \
        "the two formats disagree on the span count"

    work = Path(tempfile.mkdtemp(prefix="convert-bench-"))
    runs: dict[str, list[dict[str, Any]]] = {"ours_n10": [], "ours_n": [], "peer": []}
    try:
        for r in range(a.repeats):
            for key, python, args in (
                    ("ours_n10", sys.executable,
                     ["ours", dataset(n10, a.seed, "ours"), work / "t10.parquet"]),
                    ("ours_n", sys.executable,
                     ["ours", dataset(n, a.seed, "ours"), work / "t.parquet"]),
                    ("peer", peer_python, ["peer", dataset(n, a.seed, "peer"),
                                           work / "peer.tsv"])):
                res = run_worker(python, args)
                runs[key].append(res)
                log(f"round {r + 1}/{a.repeats} {key}: " + (res.get("error") or
                    f"{res['wall_s']:.1f} s, peak RSS {res['maxrss_kb'] / 1024:.0f} MiB, "
                    f"host steal {res.get('steal_pct', float('nan')):.0f}%"))
        info["runs"] = runs

        once: list[dict[str, Any]] = []
        if not a.no_once:
            for size in (ONCE_SIZES_QUICK if a.quick else ONCE_SIZES_FULL):
                if size > n:
                    break
                done = [r for r in once if "once_s" in r]
                if done and _once_time(once_fit(done), size) > ONCE_BUDGET_S:
                    once.append({"episodes": size, "skipped": "not run: predicted over "
                                 f"{ONCE_BUDGET_S} s"})
                    break
                res = run_worker(peer_python, ["peer-once", dataset(n, a.seed, "peer"), size],
                                 timeout=600)
                res.setdefault("episodes", size)
                once.append(res)
                log(f"peer once on {size} episodes: " + (res.get("error") or
                    f"{res['once_s']:.1f} s (per episode: {res['per_episode_s']:.1f} s)"))
                if "error" in res:
                    break
        info["peer_once"] = once

        check = None
        if (work / "t.parquet").exists() and (work / "peer.tsv").exists():
            log("comparing ids ...")
            check = compare(work / "t.parquet", work / "peer.tsv")
        info["check"] = check
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info["machine"]["load_avg_end"] = os.getloadavg()
    info["n10"] = n10
    if a.json:
        a.json.write_text(json.dumps(info, indent=1, default=str))
    report(info)
    return 0


def report(info: dict[str, Any]) -> None:
    runs, n, n10 = info["runs"], info["episodes"], info.get("n10", info["episodes"] // 10)
    spans_n = info["inputs"][f"ours@{n}"]["spans"]
    spans_n10 = info["inputs"][f"ours@{n10}"]["spans"]

    def ok(key: str) -> list[dict[str, Any]]:
        return [r for r in runs[key] if "error" not in r]

    o10, on, pe = ok("ours_n10"), ok("ours_n"), ok("peer")
    m = info["machine"]
    print(f"\nSpans -> transitions, {info['date_utc']}, {m['cpu']}, {m['cores']} cores, "
          f"{m['mem_gib']} GiB, Python {m['python']}; load average {m['load_avg_start'][0]:.1f} "
          f"at start, {m['load_avg_end'][0]:.1f} at end (other work shares this machine: "
          f"medians of {info['repeats']} fresh processes, min..max in parentheses)")
    g = info["git"]
    print(f"ours: commit {g['commit']}, trainer/transitions.py sha256 {g['transitions_py_sha256']}"
          f", trainer/columnar.py sha256 {g.get('columnar_py_sha256', '-')}"
          f"{' (uncommitted changes)' if g['transitions_py_modified'] else ''}; peer: "
          f"agentlightning {pe[0]['version'] if pe else '?'}")
    inp = info["inputs"][f"ours@{n}"]
    print(f"input: {n:,} episodes, {spans_n:,} spans, {inp['llm_calls']:,} LLM calls "
          f"(N/10: {n10:,} episodes, {spans_n10:,} spans)\n")
    rows = []

    def cpu(rs: list[dict[str, Any]], key: str) -> list[float]:
        return [r[key] for r in rs if key in r]

    if o10:
        rows.append(("ours  convert(), N/10", spans_n10, [r["wall_s"] for r in o10],
                     cpu(o10, "cpu_s"), o10))
    if on:
        rows.append(("ours  convert(), N", spans_n, [r["wall_s"] for r in on], cpu(on, "cpu_s"),
                     on))
    if pe:
        rows.append(("peer  adapt() per episode, adapt only", spans_n,
                     [r["adapt_s"] for r in pe], cpu(pe, "adapt_cpu_s"), pe))
        rows.append(("peer  unpickle + adapt() per episode", spans_n,
                     [r["wall_s"] for r in pe], cpu(pe, "cpu_s"), pe))
    print(f"{'converter':40} {'spans':>10} {'wall s':>22} {'spans/s':>22} {'peak RSS MiB':>20}"
          f" {'CPU s':>22} {'spans/CPU-s':>22} {'host steal %':>20}")
    for label, spans, walls, cpus, rs in rows:
        steal = [r["steal_pct"] for r in rs if "steal_pct" in r]
        print(f"{label:40} {spans:>10,} {_spread(walls):>22} "
              f"{_spread([spans / w for w in walls], '{:,.0f}'):>22} "
              f"{_spread([r['maxrss_kb'] / 1024 for r in rs], '{:.0f}'):>20} "
              f"{_spread(cpus):>22} {_spread([spans / c for c in cpus], '{:,.0f}'):>22} "
              f"{_spread(steal, '{:.0f}') if steal else '-':>20}")
    for r in (on or o10)[:1]:
        print(f"\nours: {r['summary']}")
    if on and pe:
        ours_rate = spans_n / _med([r["wall_s"] for r in on])
        print(f"\nspeed ratio ours/peer (median spans/s): "
              f"{ours_rate / (spans_n / _med([r['adapt_s'] for r in pe])):.2f}x against its "
              f"adapt() alone, {ours_rate / (spans_n / _med([r['wall_s'] for r in pe])):.2f}x "
              f"against unpickle + adapt()  (target: >= 20x)")
        oc, pc_ = cpu(on, "cpu_s"), cpu(pe, "adapt_cpu_s")
        if oc and pc_:
            print(f"CPU-time ratio (median spans per CPU-second, all our threads counted): "
                  f"{_med(pc_) / _med(oc):.2f}x against its adapt() alone, "
                  f"{_med(cpu(pe, 'cpu_s')) / _med(oc):.2f}x against unpickle + adapt()")
    if on and o10:
        a, b = _med([r["maxrss_kb"] for r in o10]), _med([r["maxrss_kb"] for r in on])
        a0 = _med([r["maxrss_kb"] - r["rss_after_import_kb"] for r in o10])
        b0 = _med([r["maxrss_kb"] - r["rss_after_import_kb"] for r in on])
        print(f"ours peak RSS, N/10 -> N (input x{spans_n / spans_n10:.1f}): {a / 1024:.0f} -> "
              f"{b / 1024:.0f} MiB (x{b / a:.2f}); above the RSS after imports: "
              f"{a0 / 1024:.0f} -> {b0 / 1024:.0f} MiB (x{b0 / max(a0, 1):.2f})  "
              f"(target: flat)")
    if pe:
        print(f"peer: {pe[0]['triplets']:,} triplets from {pe[0]['episodes']:,} episodes; RSS "
              f"after imports {pe[0]['rss_after_import_kb'] / 1024:.0f} MiB; its peak RSS "
              f"reflects our 500-episode chunks, not its store")
    for key in runs:
        for r in runs[key]:
            if "error" in r:
                print(f"FAILED {key}: {r['error']}")

    once = info.get("peer_once") or []
    if once:
        print("\npeer, adapt() called once on the first E episodes together "
              "(concurrent rollouts interleaved in time;\n"
              "triplets: once / per-episode calls; rewarded: calls given a reward):")
        print(f"{'E':>6} {'spans':>8} {'once s':>9} {'per-episode s':>14} {'triplets':>13} "
              f"{'rewarded':>9} {'reward of other episode':>24} {'episodes w/o own reward':>24}")
        for r in once:
            if "skipped" in r or "error" in r:
                print(f"{r['episodes']:>6} {r.get('skipped') or r.get('error')}")
                continue
            print(f"{r['episodes']:>6} {r['spans']:>8,} {r['once_s']:>9.1f} "
                  f"{r['per_episode_s']:>14.2f} "
                  f"{str(r['triplets_once']) + '/' + str(r['triplets_per_episode']):>13} "
                  f"{r['rewarded_calls']:>9,} {r['reward_from_other_episode']:>24,} "
                  f"{r['episodes_without_own_reward']:>24,}")
        done = [r for r in once if "once_s" in r]
        if done:
            fit = once_fit(done)
            sizes = " and ".join(str(r["episodes"]) for r in done[-2:])
            print(f"extrapolated (t = a*E + b*E^2 through E = {sizes}) to all {n:,} episodes "
                  f"at once: ~{_duration(_once_time(fit, n))} (not run)")

    c = info.get("check")
    if c:
        print(f"\nids check (ours keyed by span id, peer by gen_ai.response.id):\n"
              f"  peer triplets {c['peer_calls']:,}; ours transitions {c['ours_transitions']:,} "
              f"covering {c['ours_calls']:,} LLM calls\n"
              f"  single-call transitions: {c['single_matched']:,} identical prompt and "
              f"completion ids, {c['single_mismatched']:,} differ\n"
              f"  merged turns (tool call + follow-up): {c['merged_transitions']:,} "
              f"transitions of {c['merged_calls']:,} calls, {c['merged_matched']:,} equal to "
              f"the peer's calls piecewise, {c['merged_mismatched']:,} differ\n"
              f"  only in ours: {c['not_in_peer']:,}; peer calls not in ours: "
              f"{c['peer_calls_not_in_ours']:,}\n"
              f"  agent name equal on {c['agent_name_equal']:,} calls, differs on "
              f"{c['agent_name_differs']:,}\n"
              f"  rewards: the peer puts one on {c['peer_rewarded_calls']:,} calls (last call of "
              f"each episode), equal to ours there on {c['peer_reward_equal_ours']:,}; ours "
              f"rewards every transition")
        for line in c["mismatches"]:
            print(f"  first mismatches: {line}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(sys.argv[2:]))
    sys.exit(main())
