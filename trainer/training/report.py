"""A training run -> plots (one PNG per panel) and one self-contained HTML page.

    records, problems = load_metrics("runs/r1")          # a metrics.jsonl or its directory
    summary = summarise(records, problems)                # numbers for the table, per adapter
    html = render(records, "runs/r1/report", problems=problems,
                  adapters=find_adapters("runs/r1")[0])   # -> runs/r1/report/report.html

The input is the trainer's ``metrics.jsonl`` (one JSON object per micro-batch). The x axis of
every panel is the micro-batch index in file order, so a file that several rounds appended to
reads left to right (a dotted line marks where a round, or a resume from a checkpoint,
starts); each adapter is one line.
Malformed lines are skipped and reported as ``file:line``; NaN and infinite values are left out
of the plots and counted (``grad_norm`` is NaN by design on micro-batches without an optimizer
step: those mark "no step", not bad data).

Plots use matplotlib's Agg renderer through ``matplotlib.figure.Figure`` (never pyplot), so no
display is needed and no global backend state is touched. Nothing here imports torch.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import io
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple, TypeGuard

from agl_bridge.settings import replace_text
from agl_bridge.trainer.adapters import METADATA_FILE

METRICS_FILE = "metrics.jsonl"
REPORT_FILE = "report.html"

# Numeric fields the trainer writes. Others are kept in the records but not checked.
NUMERIC_FIELDS = (
    "step", "micro_batch", "loss", "grad_norm", "reward_mean", "reward_std", "advantage_mean",
    "advantage_abs_mean", "tokens", "tokens_per_s", "memory_mb", "learning_rate",
    "clip_fraction", "ratio_mean", "kl", "importance_weight_mean", "behaviour_logprob_abs_diff",
    "skipped_zero_variance", "policy_loss", "value_loss", "value_clip_fraction", "value_mean",
    "return_mean", "value_grad_norm",
)
# Fields summarised per adapter as final (last finite) and mean (over finite values).
SUMMARY_FIELDS = (
    "loss", "reward_mean", "advantage_mean", "advantage_abs_mean", "kl", "clip_fraction",
    "importance_weight_mean", "behaviour_logprob_abs_diff", "value_loss", "value_mean",
)
MAX_LISTED_PROBLEMS = 50  # in the HTML; all are counted


class Panel(NamedTuple):
    """One PNG: ``series`` are (field, label suffix, line style); ``band`` draws +-std."""

    name: str
    title: str
    ylabel: str
    series: list[tuple[str, str, str]]
    band: tuple[str, str] | None = None

    @property
    def fields(self) -> list[str]:
        return [f for f, _, _ in self.series] + ([self.band[1]] if self.band else [])


PANELS = [
    Panel("loss", "Loss", "loss", [("loss", "", "-")]),
    Panel("reward", "Reward (mean ± std over the micro-batch)", "reward",
          [("reward_mean", "", "-")], band=("reward_mean", "reward_std")),
    Panel("advantage", "Advantage: mean (solid) and mean |advantage| (dashed)", "advantage",
          [("advantage_mean", " mean", "-"), ("advantage_abs_mean", " |adv| mean", "--")]),
    Panel("critic", "PPO's critic: value loss (solid), mean value (dashed), mean return "
          "(dotted)", "value", [("value_loss", " value loss", "-"), ("value_mean", " value", "--"),
                                ("return_mean", " return", ":")]),
    Panel("kl", "KL(policy ‖ base), k3 estimator (0 when beta = 0)", "KL", [("kl", "", "-")]),
    Panel("clip_fraction", "Clip fraction (tokens whose ratio was clipped)", "fraction",
          [("clip_fraction", "", "-")]),
    Panel("tokens_per_s", "Throughput", "completion tokens / s", [("tokens_per_s", "", "-")]),
    Panel("memory", "Peak memory (CUDA max allocated, or process max RSS on CPU)", "MB",
          [("memory_mb", "", "-")]),
    Panel("importance_weight", "Importance weight π_old / π_sampler (mean, capped)", "weight",
          [("importance_weight_mean", "", "-")]),
    Panel("behaviour_gap", "|trainer − sampler| logprob (mean over tokens)", "nats",
          [("behaviour_logprob_abs_diff", "", "-")]),
    Panel("grad_norm", "Gradient norm before clipping (optimizer steps only)", "norm",
          [("grad_norm", "", "-")]),
]


# -- loading ----------------------------------------------------------------------------------
def metrics_file(path: str | os.PathLike[str]) -> Path:
    """The metrics file for ``path`` (the file itself, or ``metrics.jsonl`` in a directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / METRICS_FILE
        if not p.is_file():
            raise FileNotFoundError(f"no {METRICS_FILE} in {path}")
        return p
    if not p.exists():
        raise FileNotFoundError(f"no such metrics file: {path}")
    return p


def _is_number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fits_float(v: float) -> bool:
    try:
        float(v)
    except OverflowError:
        return False
    return True


def load_metrics(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Records (one dict per good line, with ``_line``: its line number) and problems
    (``file:line: what``, one per malformed line: not JSON, not an object, or a known numeric
    field holding something else than a number; ``null`` counts as absent).

    A missing or empty file, or one with no good line, is an error (``FileNotFoundError`` or
    ``ValueError``) naming the path; a bad line is skipped, never an exception.
    """
    p = metrics_file(path)
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    non_blank = 0
    # errors="replace": an undecodable byte becomes U+FFFD, never an exception
    with open(p, encoding="utf-8", errors="replace") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            non_blank += 1
            where = f"{p}:{n}"
            try:
                rec = json.loads(raw)  # columns as in the file
            except json.JSONDecodeError as exc:
                if not raw.endswith("\n"):  # only the last line can lack its newline
                    problems.append(f"{where}: incomplete last line (still being written?)")
                else:
                    problems.append(f"{where}: not JSON ({exc.msg}, column {exc.colno})")
                continue
            except (ValueError, RecursionError) as exc:  # huge integers, deep nesting
                problems.append(f"{where}: not JSON ({str(exc)[:80]})")
                continue
            if not isinstance(rec, dict):
                problems.append(f"{where}: not a JSON object ({type(rec).__name__})")
                continue
            bad = [k for k in NUMERIC_FIELDS if rec.get(k) is not None and not _is_number(rec[k])]
            if bad:
                problems.append(f"{where}: {bad[0]} is not a number ({str(rec[bad[0]])[:40]!r})")
                continue
            huge = [k for k, v in rec.items() if _is_number(v) and not _fits_float(v)]
            if huge:
                problems.append(f"{where}: {huge[0]} is out of range")
                continue
            for key in NUMERIC_FIELDS:
                if key in rec and rec[key] is None:
                    del rec[key]
            rec["adapter"] = str(rec.get("adapter", "(unnamed)"))
            rec["_line"] = n
            records.append(rec)
    if non_blank == 0:
        raise ValueError(f"{p}: empty metrics file, nothing to report")
    if not records:
        raise ValueError(f"{p}: no readable line ({len(problems)} malformed; first: "
                         f"{problems[0]})")
    return records, problems


def find_adapters(run_dir: str | os.PathLike[str], max_depth: int = 4
                  ) -> tuple[list[dict[str, Any]], list[str]]:
    """Adapter version directories (holding ``agl_bridge_adapter.json``) under ``run_dir``, at
    most ``max_depth`` levels down (``adapters/<name>/v0001`` is 3). Hidden directories (the
    trainer's unfinished ``.tmp-*``) are skipped. Returns (metadata dicts with ``_dir``,
    problems)."""
    root = Path(run_dir)
    found: list[dict[str, Any]] = []
    problems: list[str] = []
    if not root.is_dir():
        return found, problems
    base_depth = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root):
        depth = len(Path(dirpath).parts) - base_depth
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")) \
            if depth < max_depth else []
        if METADATA_FILE not in filenames:
            continue
        meta_path = Path(dirpath) / METADATA_FILE
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            problems.append(f"{meta_path}: unreadable adapter metadata ({exc})")
            continue
        if not isinstance(meta, dict):
            problems.append(f"{meta_path}: unreadable adapter metadata (not a JSON object)")
            continue
        meta["_dir"] = str(Path(dirpath))
        found.append(meta)
    found.sort(key=lambda m: (str(m.get("adapter_name")), _as_int(m.get("version")), m["_dir"]))
    return found, problems


def _as_int(v: Any) -> int:
    return int(v) if _is_number(v) and math.isfinite(v) else -1


# -- numbers ----------------------------------------------------------------------------------
def _finite(records: Iterable[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in records if key in r and math.isfinite(r[key])]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def run_starts(records: list[dict[str, Any]]) -> list[int]:
    """Indices where a training round starts: the first record, and every record whose
    ``micro_batch`` does not follow the previous one's (rounds append to the same file; a run
    resumed from a checkpoint goes back to the checkpoint's micro-batch)."""
    starts = [0] if records else []
    for i in range(1, len(records)):
        prev, cur = records[i - 1].get("micro_batch"), records[i].get("micro_batch")
        if prev is not None and cur is not None and cur <= prev:
            starts.append(i)
    return starts


def _is_step(r: dict[str, Any]) -> bool:
    # the trainer writes grad_norm = NaN on micro-batches that only accumulate gradients
    g = r.get("grad_norm")
    return g is not None and not math.isnan(g)


def adapter_steps(records: list[dict[str, Any]]) -> dict[str, int]:
    """Optimizer steps that updated each adapter: steps whose accumulation window (the
    micro-batches since the previous step) held at least one of its micro-batches. With
    per-agent LoRA and gradient accumulation one step can update several adapters."""
    counts = {r["adapter"]: 0 for r in records}
    window: set[str] = set()
    starts = set(run_starts(records))
    for i, r in enumerate(records):
        if i in starts:
            window = set()
        window.add(r["adapter"])
        if _is_step(r):
            for name in window:
                counts[name] += 1
            window = set()
    return counts


def _stats(records: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    tps = _finite(records, "tokens_per_s")
    mem = _finite(records, "memory_mb")
    out: dict[str, Any] = {
        "micro_batches": len(records),
        "steps": steps,
        "tokens": sum(_finite(records, "tokens")),
        "mean_tokens_per_s": _mean(tps),
        "peak_memory_mb": max(mem) if mem else None,
        "final": {}, "mean": {},
    }
    for key in SUMMARY_FIELDS:
        values = _finite(records, key)
        if values:
            out["final"][key] = values[-1]
            out["mean"][key] = _mean(values)
    return out


def summarise(records: list[dict[str, Any]], problems: Iterable[str] = ()) -> dict[str, Any]:
    """Totals and per-adapter numbers. ``steps`` counts optimizer steps (micro-batches with a
    grad_norm; per adapter: see :func:`adapter_steps`); ``mean_tokens_per_s`` is the mean over
    micro-batches; ``final`` is the last finite value, ``mean`` the mean of the finite values;
    ``non_finite`` counts NaN/inf values per field (not grad_norm's NaN: that means "no step");
    ``malformed`` counts ``problems``."""
    problems = list(problems)
    by_adapter: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_adapter.setdefault(r["adapter"], []).append(r)
    non_finite: dict[str, int] = {}
    for r in records:
        for key, v in r.items():
            if key.startswith("_") or not _is_number(v) or math.isfinite(v):
                continue
            if key == "grad_norm" and math.isnan(v):
                continue
            non_finite[key] = non_finite.get(key, 0) + 1
    starts = run_starts(records)
    skipped = sum(int(records[s].get("skipped_zero_variance", 0) or 0) for s in starts
                  if math.isfinite(records[s].get("skipped_zero_variance", 0) or 0))
    total = _stats(records, sum(_is_step(r) for r in records))
    total.pop("final")
    total.pop("mean")
    steps = adapter_steps(records)
    return {
        **total,
        "rounds": len(starts),
        "adapters": {name: _stats(rs, steps[name]) for name, rs in sorted(by_adapter.items())},
        "skipped_zero_variance": skipped,
        "non_finite": dict(sorted(non_finite.items())),
        "malformed": len(problems),
        "problems": problems,
    }


# -- plots ------------------------------------------------------------------------------------
def new_figure(width: float = 8.0, height: float = 3.6) -> Any:
    """A figure as both report pages draw them (Agg, never pyplot: see the module's text)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def png_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _colours(names: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def _legend(label: str) -> str:
    """Adapter names are user data: '$' would start mathtext, a leading '_' hides the entry."""
    label = label.replace("$", r"\$")
    return "\u200b" + label if label.startswith("_") else label


def _plot_panel(panel: Panel, records: list[dict[str, Any]], names: list[str],
                colours: dict[str, Any], starts: list[int], path: Path) -> int:
    """Draws one panel to ``path``; returns the number of points drawn (0: nothing written)."""
    fig = new_figure()
    ax = fig.add_subplot()
    drawn = 0
    for name in names:
        for field, suffix, style in panel.series:
            pts = [(i, float(r[field])) for i, r in enumerate(records)
                   if r["adapter"] == name and field in r and math.isfinite(r[field])]
            if not pts:
                continue
            xs, ys = zip(*pts)
            ax.plot(xs, ys, style, color=colours[name], label=_legend(name + suffix),
                    linewidth=1.4,
                    marker="o" if len(xs) <= 60 else None, markersize=3)
            drawn += len(xs)
        if panel.band:
            mean_f, std_f = panel.band
            band = [(i, float(r[mean_f]), float(r[std_f])) for i, r in enumerate(records)
                    if r["adapter"] == name and mean_f in r and std_f in r
                    and math.isfinite(r[mean_f]) and math.isfinite(r[std_f])]
            if band:
                xs, ms, ss = zip(*band)
                ax.fill_between(xs, [m - s for m, s in zip(ms, ss)],
                                [m + s for m, s in zip(ms, ss)], color=colours[name],
                                alpha=0.18, linewidth=0)
    if not drawn:
        return 0
    for k, s in enumerate(starts[1:]):
        ax.axvline(s - 0.5, color="0.5", linestyle=":", linewidth=1,
                   label="new round / resume" if k == 0 else None)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("micro-batch (in file order)")
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    ax.set_xlim(-0.5, max(len(records) - 0.5, 0.5))
    from matplotlib.ticker import MaxNLocator

    locator = ax.xaxis.get_major_locator()  # the default AutoLocator is a MaxNLocator
    if isinstance(locator, MaxNLocator):
        locator.set_params(integer=True)
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(title="adapter", fontsize="small", title_fontsize="small",
              ncol=max(1, math.ceil(len(handles) / 8)), loc="best")
    path.write_bytes(png_bytes(fig))
    return drawn


# -- HTML -------------------------------------------------------------------------------------
def fmt(x: Any) -> str:
    """How numbers appear in the page: integers whole, large values with thousands separators,
    others to 4 significant digits; missing values as an en dash."""
    if x is None:
        return "–"
    if isinstance(x, bool) or not _is_number(x):
        return html.escape(str(x))
    if not math.isfinite(x):
        return str(x)
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1100px;padding:0 1em;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f4f4f4}
.note{color:#555;font-size:.9em}.warn{color:#a33}
figure{margin:1em 0}figcaption{font-size:.85em;color:#555}
img{max-width:100%;height:auto;border:1px solid #eee}code{font-size:.9em}
"""


def table(head: list[str], rows: list[list[str]]) -> str:
    """An HTML table; ``head`` and the cells are HTML already (escaped by the caller)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def img(png: bytes, alt: str) -> str:
    """A PNG embedded as a data URI: the page stays one self-contained file."""
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def figure(png: bytes, alt: str, caption: str, anchor: str = "") -> str:
    """:func:`img` with its caption (HTML)."""
    ident = f' id="{html.escape(anchor)}"' if anchor else ""
    return f"<figure{ident}>{img(png, alt)}<figcaption>{caption}</figcaption></figure>"


def write_page(target: Path, title: str, body: list[str]) -> Path:
    """The page (``body``: HTML parts, one a line) written atomically: a reader never sees
    half of it."""
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
    replace_text(target, page)
    return target


def _summary_html(s: dict[str, Any]) -> str:
    parts = [table(
        ["micro-batches", "optimizer steps", "rounds / resumes", "total tokens", "mean tokens/s",
         "peak memory (MB)", "zero-variance transitions skipped", "malformed lines"],
        [[fmt(s["micro_batches"]), fmt(s["steps"]), fmt(s["rounds"]), fmt(s["tokens"]),
          fmt(s["mean_tokens_per_s"]), fmt(s["peak_memory_mb"]),
          fmt(s["skipped_zero_variance"]), fmt(s["malformed"])]])]
    fields = [f for f in SUMMARY_FIELDS if any(f in a["final"] for a in s["adapters"].values())]
    head = ["adapter", "micro-batches", "steps", "tokens", "mean tokens/s", "peak MB"]
    head += [f"{f} final / mean" for f in fields]
    rows = []
    for name, a in s["adapters"].items():
        row = [html.escape(name), fmt(a["micro_batches"]), fmt(a["steps"]), fmt(a["tokens"]),
               fmt(a["mean_tokens_per_s"]), fmt(a["peak_memory_mb"])]
        row += [f"{fmt(a['final'].get(f))} / {fmt(a['mean'].get(f))}" for f in fields]
        rows.append(row)
    parts.append(table(head, rows))
    parts.append('<p class="note">steps: optimizer steps (micro-batches with a grad_norm); '
                 "an adapter's steps are those that updated it (its micro-batches were in the "
                 "step's accumulation window). final: last finite value; mean: over finite "
                 "values and micro-batches.</p>")
    if s["non_finite"]:
        listed = ", ".join(f"{html.escape(k)}: {v}" for k, v in s["non_finite"].items())
        parts.append(f'<p class="warn">NaN/inf values left out of the plots and means: '
                     f"{listed}.</p>")
    return "\n".join(parts)


def _adapters_html(adapters: list[dict[str, Any]], run_dir: Path | None) -> str:
    if not adapters:
        return '<p class="note">No adapter metadata (agl_bridge_adapter.json) found.</p>'
    rows = []
    for m in adapters:
        d = Path(m["_dir"])
        if run_dir is not None:
            try:
                d = d.relative_to(run_dir)
            except ValueError:
                pass
        fp = str(m.get("base_model_fingerprint") or "")
        created = m.get("created_unix")
        when = (_dt.datetime.fromtimestamp(float(created), _dt.timezone.utc
                                           ).strftime("%Y-%m-%d %H:%M")
                if _is_number(created) and math.isfinite(created) else None)
        rows.append([
            html.escape(str(m.get("adapter_name", "?"))), fmt(m.get("version")),
            f"<code>{html.escape(str(d))}</code>",
            f'<code title="{html.escape(fp)}">{html.escape(fp[:12])}</code>' if fp else "–",
            f"<code>{html.escape(str(m.get('base_model', '–')))}</code>",
            fmt(m.get("steps")), fmt(m.get("transitions")),
            html.escape(Path(str(m["init_adapter"])).name) if m.get("init_adapter") else "–",
            fmt(when)])
    out = table(["adapter", "version", "directory", "base model fingerprint", "base model",
                  "steps", "transitions", "continued from", "created (UTC)"], rows)
    fps = {m.get("base_model_fingerprint") for m in adapters}
    if len(fps) > 1:
        out += (f'<p class="warn">These adapters were trained on {len(fps)} different base '
                "models (fingerprints differ).</p>")
    return out


def _script_safe(text: str) -> str:
    """JSON that cannot end its <script> element or be read as markup: <, >, & as escapes."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(records: list[dict[str, Any]], out_dir: str | os.PathLike[str], *,
           problems: Iterable[str] = (), adapters: list[dict[str, Any]] | None = None,
           adapter_problems: Iterable[str] = (), source: str | os.PathLike[str] | None = None,
           run_dir: str | os.PathLike[str] | None = None) -> Path:
    """Writes one PNG per panel with data and ``report.html`` (the PNGs embedded as data URIs,
    so the page is one self-contained file) into ``out_dir``; returns the HTML's path.

    ``problems`` (from :func:`load_metrics`), ``adapters`` and ``adapter_problems`` (from
    :func:`find_adapters`) are shown in the page; ``source`` names the metrics file.
    """
    if not records:
        raise ValueError("no metrics records to report on")
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("plots need matplotlib: pip install 'agl-bridge[train]' "
                           "(or pip install matplotlib)") from exc
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    problems = list(problems)
    summary = summarise(records, problems)
    names = list(summary["adapters"])
    colours = _colours(names)
    starts = run_starts(records)

    figures = []
    for panel in PANELS:
        png = out / f"{panel.name}.png"
        if _plot_panel(panel, records, names, colours, starts, png):
            left_out = sum(summary["non_finite"].get(f, 0) for f in panel.fields)
            figures.append((panel, png, left_out))
        elif png.exists():
            png.unlink()  # stale from an earlier report in this directory
    title = f"agl-bridge training report: {source}" if source else "agl-bridge training report"
    made = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = [f"<h1>{html.escape(title)}</h1>",
            (f'<p class="note">Generated {made}; adapters: '
             f"{html.escape(', '.join(names))}.</p>"),
            "<h2>Summary</h2>", _summary_html(summary)]
    if problems:
        items = "".join(f"<li><code>{html.escape(p)}</code></li>"
                        for p in problems[:MAX_LISTED_PROBLEMS])
        more = (f"<li>… and {len(problems) - MAX_LISTED_PROBLEMS} more</li>"
                if len(problems) > MAX_LISTED_PROBLEMS else "")
        body.append(f'<h2 class="warn">Malformed lines skipped ({len(problems)})</h2>'
                    f"<ul>{items}{more}</ul>")
    adapter_problems = list(adapter_problems)
    if adapters is not None or adapter_problems:
        body += ["<h2>Adapters</h2>",
                 _adapters_html(adapters or [], Path(run_dir) if run_dir is not None else None)]
        body += [f'<p class="warn"><code>{html.escape(p)}</code></p>' for p in adapter_problems]
    body.append("<h2>Panels</h2>")
    for panel, png, left_out in figures:
        note = f"; {left_out} NaN/inf value(s) left out" if left_out else ""
        body.append(figure(png.read_bytes(), panel.title, png.name + note, panel.name))
    blob = json.dumps(summary, default=str, sort_keys=True)
    body.append(f'<script type="application/json" id="summary">{_script_safe(blob)}</script>')
    return write_page(out / REPORT_FILE, title, body)


def report(path: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None,
           adapter_dirs: Iterable[str | os.PathLike[str]] = ()
           ) -> tuple[Path, dict[str, Any], list[str]]:
    """Everything the CLI does: load, find adapters (under the run directory and
    ``adapter_dirs``), render. ``out_dir`` defaults to ``report/`` beside the metrics file.
    Returns (report.html, summary, problems: malformed lines, then unreadable adapter
    metadata)."""
    mfile = metrics_file(path)
    run_dir = mfile.parent
    records, problems = load_metrics(mfile)
    adapters, meta_problems = find_adapters(run_dir)
    for d in adapter_dirs:
        if not Path(d).is_dir():
            raise FileNotFoundError(f"no such adapters directory: {d}")
        more, more_problems = find_adapters(d)
        adapters += more
        meta_problems += more_problems
    unique: dict[str, dict[str, Any]] = {}  # an --adapters directory inside the run: once
    for m in adapters:
        unique.setdefault(os.path.realpath(m["_dir"]), m)
    out = Path(out_dir) if out_dir is not None else run_dir / "report"
    html_path = render(records, out, problems=problems, adapters=list(unique.values()),
                       adapter_problems=meta_problems, source=mfile, run_dir=run_dir)
    return html_path, summarise(records, problems), problems + meta_problems
