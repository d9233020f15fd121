"""What the zero-code start-up hook ``agl_bridge_auto.pth`` costs every Python process.

Why: the wheel installs ``agl_bridge_auto.pth`` at the top of site-packages, so *every* Python
start in that environment runs its line, whether or not the program uses agl-bridge. The README
promises that with ``AGL_BRIDGE_AUTO`` unset it costs one dictionary lookup. This checks that
claim three ways, each side by side with its peer:

(a) in-process, with the variable unset: nanoseconds per execution of the .pth line (read from
    the repo file), precompiled and as ``site`` runs it (``exec`` of the string, so compiled
    each time), next to a bare ``os.environ.get`` (the "one dictionary lookup") and an
    ``import os`` line; and ``site.addpackage`` on our .pth (open, read, exec) next to the same
    call on an empty .pth.
(b) whole-interpreter start-up: a bare venv ``.cache/bench-startup-venv`` (``python -m venv
    --without-pip``), ``python -c pass`` timed N times without the .pth in its site-packages
    and with a copy of it there, the two interleaved (random order per pair) to cancel drift.
(c) what activation itself costs, in the dev venv (agl_bridge installed, the .pth present):
    ``python -c pass`` with ``AGL_BRIDGE_AUTO`` unset vs ``=1`` (Parquet export to a temp dir),
    and the same for ``python -c "import openai"`` (where the instrumentor is switched on by
    the import hook), plus the biggest imports activation pulls in (``-X importtime``).

Run: ``.venv/bin/python benchmarks/startup_hook.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
PTH = REPO / "agl_bridge_auto.pth"
BARE_VENV = REPO / ".cache" / "bench-startup-venv"
AUTO_ENV = "AGL_BRIDGE_AUTO"


def pth_line() -> str:
    lines = [line.rstrip("\n") for line in PTH.read_text().splitlines()
             if line.startswith(("import ", "import\t"))]
    if len(lines) != 1:
        raise SystemExit(f"{PTH}: expected exactly one import line, found {len(lines)}")
    return lines[0]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _stats(xs: list[float]) -> dict:
    return {"n": len(xs), "min": min(xs), "median": statistics.median(xs),
            "p10": _pct(xs, 0.10), "p90": _pct(xs, 0.90)}


# -- (a) in-process ------------------------------------------------------------------------------
def in_process(quick: bool) -> dict:
    os.environ.pop(AUTO_ENV, None)
    line = pth_line()
    code = compile(line, str(PTH), "exec")
    tmp = Path(tempfile.mkdtemp(prefix="agl-bench-pth-"))
    try:
        ours_dir, empty_dir = tmp / "ours", tmp / "empty"
        ours_dir.mkdir()
        empty_dir.mkdir()
        shutil.copy(PTH, ours_dir / PTH.name)
        (empty_dir / PTH.name).write_text("")
        saved_path = list(sys.path)
        cases = {
            "pth line, precompiled (exec code)": ("exec(code, {})", {"code": code}),
            "pth line as site runs it (exec str)": ("exec(line, {})", {"line": line}),
            "peer: os.environ.get(name) alone": ("get(name)", {"get": os.environ.get,
                                                               "name": AUTO_ENV}),
            "peer: exec('import os') line": ("exec(c, {})",
                                             {"c": compile("import os", "x", "exec")}),
            "site.addpackage(our .pth)": ("addpackage(d, n, set())",
                                          {"addpackage": site.addpackage,
                                           "d": str(ours_dir), "n": PTH.name}),
            "peer: site.addpackage(empty .pth)": ("addpackage(d, n, set())",
                                                  {"addpackage": site.addpackage,
                                                   "d": str(empty_dir), "n": PTH.name}),
        }
        repeats = 7 if quick else 25
        out = {}
        for name, (stmt, env) in cases.items():
            timer = timeit.Timer(stmt, globals=env)
            loops, _ = timer.autorange()  # at least 0.2 s per repeat
            if quick:
                loops = max(1, loops // 2)
            per = [t / loops * 1e9 for t in timer.repeat(repeat=repeats, number=loops)]
            sys.path[:] = saved_path  # addpackage appends nothing for these files, but be safe
            out[name] = {**_stats(per), "loops": loops}
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- process timing ------------------------------------------------------------------------------
def _spawn_ms(argv: list[str], env: dict[str, str], cwd: str) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    ms = (time.perf_counter() - t0) * 1e3
    if r.returncode != 0:
        raise RuntimeError(f"{argv} failed: {r.stderr.decode()[-500:]}")
    return ms


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("AGL_BRIDGE_", "OTEL_", "PYTHON"))}


def _interleaved(cases: dict[str, tuple], n: int, before=None) -> dict[str, list[float]]:
    """Run each case n times, in a fresh random order each round: {case: [ms, ...]}."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for _ in range(n):
        random.shuffle(names)
        for name in names:
            argv, env, cwd = cases[name]
            if before is not None:
                before(name)
            times[name].append(_spawn_ms(argv, env, cwd))
    return times


def _paired(a: list[float], b: list[float]) -> dict:
    diffs = [y - x for x, y in zip(a, b)]
    return {"median_diff_ms": statistics.median(diffs), "p10": _pct(diffs, 0.1),
            "p90": _pct(diffs, 0.9)}


# -- (b) bare venv, with and without the .pth -----------------------------------------------------
def bare_venv(n: int, log) -> dict:
    python = BARE_VENV / "bin" / "python"
    if not python.exists():
        log(f"creating {BARE_VENV} ...")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(BARE_VENV)],
                       check=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    target = Path(purelib) / PTH.name
    others = sorted(p.name for p in Path(purelib).glob("*.pth") if p != target)
    env = _clean_env()
    cwd = tempfile.gettempdir()
    argv = [str(python), "-c", "pass"]

    def place(name: str) -> None:
        if name == "with .pth":
            if not target.exists():
                shutil.copy(PTH, target)
        else:
            target.unlink(missing_ok=True)

    try:
        for name in ("without .pth", "with .pth"):  # warm the page cache
            place(name)
            _spawn_ms(argv, env, cwd)
        times = _interleaved({"without .pth": (argv, env, cwd),
                              "with .pth": (argv, env, cwd)}, n, before=place)
    finally:
        target.unlink(missing_ok=True)
    return {"venv": str(BARE_VENV.relative_to(REPO)), "other_pth_files": others,
            "runs": {k: _stats(v) for k, v in times.items()},
            "with_minus_without": _paired(times["without .pth"], times["with .pth"])}


# -- (c) activation in the dev venv ----------------------------------------------------------------
def activation(n: int, n_import: int) -> dict:
    python = sys.executable
    purelib = Path(subprocess.run([python, "-c", "import sysconfig; "
                                   "print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    has_pth = (purelib / PTH.name).exists()
    tmp = tempfile.mkdtemp(prefix="agl-bench-auto-")
    off = _clean_env()
    on = dict(off, AGL_BRIDGE_AUTO="1", AGL_BRIDGE_PARQUET_DIR=str(Path(tmp) / "traces"),
              OTEL_SERVICE_NAME="bench")
    try:
        out: dict = {"python": python, "pth_in_site_packages": has_pth}
        for label, code, runs in (("python -c pass", "pass", n),
                                  ("python -c 'import openai'", "import openai", n_import)):
            argv = [python, "-c", code]
            for env in (off, on):  # warm-up
                _spawn_ms(argv, env, tmp)
            times = _interleaved({"AGL_BRIDGE_AUTO unset": (argv, off, tmp),
                                  "AGL_BRIDGE_AUTO=1": (argv, on, tmp)}, runs)
            out[label] = {"runs": {k: _stats(v) for k, v in times.items()},
                          "set_minus_unset": _paired(times["AGL_BRIDGE_AUTO unset"],
                                                     times["AGL_BRIDGE_AUTO=1"])}
        out["imports_on_activation"] = _top_imports(python, off, on, tmp)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _import_self_times(python: str, env: dict[str, str], cwd: str) -> dict[str, int]:
    r = subprocess.run([python, "-X", "importtime", "-c", "pass"], env=env, cwd=cwd,
                       capture_output=True, text=True)
    per_pkg: dict[str, int] = {}
    for line in r.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            pkg = m.group(4).split(".")[0]
            per_pkg[pkg] = per_pkg.get(pkg, 0) + int(m.group(1))
    return per_pkg


def _top_imports(python: str, off: dict[str, str], on: dict[str, str], cwd: str,
                 top: int = 10) -> list[dict]:
    """Where activation's start-up time goes: per top-level package, the self import time
    (``-X importtime``, summed over its modules) with the hook active minus with it off."""
    before = _import_self_times(python, off, cwd)
    after = _import_self_times(python, on, cwd)
    added = {k: v - before.get(k, 0) for k, v in after.items()}
    ranked = sorted(added.items(), key=lambda kv: -kv[1])[:top]
    return [{"package": k, "added_ms": v / 1e3} for k, v in ranked if v > 0]


# -- output ------------------------------------------------------------------------------------
def print_report(res: dict) -> None:
    print(f"\nstart-up hook cost ({res['meta']['machine']})\n")
    print("(a) in-process, AGL_BRIDGE_AUTO unset: ns per execution; min of repeats (the figure "
          "timeit recommends), then median [p10..p90]")
    for name, s in res["in_process"].items():
        print(f"  {name:42} {s['min']:9.0f}   {s['median']:9.0f} [{s['p10']:.0f}..{s['p90']:.0f}]")
    b = res["bare_venv"]
    print(f"\n(b) bare venv {b['venv']} (other .pth: {', '.join(b['other_pth_files']) or 'none'}): "
          f"'python -c pass', ms, {b['runs']['with .pth']['n']} interleaved runs each")
    for name, s in b["runs"].items():
        print(f"  {name:42} median {s['median']:7.2f}   p10 {s['p10']:7.2f}   p90 {s['p90']:7.2f}")
    d = b["with_minus_without"]
    print(f"  {'with - without (paired)':42} median {d['median_diff_ms']:+7.3f}   "
          f"p10 {d['p10']:+7.2f}   p90 {d['p90']:+7.2f}")
    c = res["activation"]
    print(f"\n(c) dev venv ({'has' if c['pth_in_site_packages'] else 'LACKS'} the .pth): "
          f"AGL_BRIDGE_AUTO unset vs =1, ms")
    for label in ("python -c pass", "python -c 'import openai'"):
        runs = c[label]["runs"]
        n = next(iter(runs.values()))["n"]
        print(f"  {label} ({n} interleaved runs each)")
        for name, s in runs.items():
            print(f"    {name:40} median {s['median']:7.1f}   p10 {s['p10']:7.1f}   "
                  f"p90 {s['p90']:7.1f}")
        d = c[label]["set_minus_unset"]
        print(f"    {'=1 minus unset (paired)':40} median {d['median_diff_ms']:+7.1f}   "
              f"p10 {d['p10']:+7.1f}   p90 {d['p90']:+7.1f}")
    print("  where activation's start-up time goes (-X importtime, one run each way: import time "
          "added per top-level package, ms):")
    print("    " + ", ".join(f"{x['package']} {x['added_ms']:.0f}"
                             for x in c["imports_on_activation"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer runs (under a minute)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    ap.add_argument("-n", type=int, help="runs per case for (b) (default 400, quick 30)")
    args = ap.parse_args()
    n_bare = args.n or (30 if args.quick else 400)
    n_act = 6 if args.quick else 60
    n_imp = 3 if args.quick else 30

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.monotonic()
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                       f"{platform.python_version()}, load avg at start {os.getloadavg()[0]:.1f}"}
    log("(a) in-process ...")
    res = {"benchmark": "startup_hook", "meta": meta, "pth_line": pth_line(),
           "in_process": in_process(args.quick)}
    log("(b) bare venv ...")
    res["bare_venv"] = bare_venv(n_bare, log)
    log("(c) activation ...")
    res["activation"] = activation(n_act, n_imp)
    meta["seconds"] = round(time.monotonic() - t0)
    print_report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
