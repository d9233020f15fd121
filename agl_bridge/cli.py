"""``agl-bridge``: the pipeline's stages from the shell.

    agl-bridge demo                                 the main job: a team learns from its traces
    agl-bridge loop --config loop.toml              train, gate, publish, watch: any team
    agl-bridge convert SPANS OUT.parquet            spans -> transitions, with a summary
    agl-bridge train TRACES --base-model DIR        convert and train -> new adapter versions
    agl-bridge export TRANSITIONS --format sft --out DIR   Hugging Face datasets for TRL
    agl-bridge report RUN_DIR                       a run's metrics as plots and one HTML page
    agl-bridge serve --model DIR                    vLLM with runtime LoRA (one or more replicas)
    agl-bridge publish ADAPTER_DIR --alias NAME     validate, load, probe, switch the alias
    agl-bridge rollback NAME v5                     an earlier version live again
    agl-bridge collect --out DIR                    an OTLP receiver (HTTP 4318, gRPC 4317)
    agl-bridge import FILES_OR_DIRS --out DIR       OTLP/JSON Collector files -> span Parquet
    agl-bridge recover DIR                          write-ahead logs of dead writers -> Parquet
    agl-bridge feedback FILE --out DIR              scores that arrived later -> span Parquet
    agl-bridge judge SPANS --rubric F --base-url U --model M   LLM judge scores -> evaluations
    agl-bridge apo SPANS --workdir W --config apo.toml   prompt candidates, gated, published
    agl-bridge prompts publish|rollback|history|diff   prompt versions in a registry
    agl-bridge replay SPANS --team CMD --out DIR    stored episodes' inputs played K times again
    agl-bridge aliases-serve --registry DIR         alias and prompt tables over HTTP, other hosts

Commands with settings (demo, loop, convert, train, export, judge, serve) take them as flags
and as a file (``--config``) with the same names, and show the values a run would use
(``--print-config``).
Those that start vLLM (serve, loop, demo) pass what follows ``--`` to it as its own flags.

Training imports torch only when ``train`` runs, so the capture install can use ``convert``.
"""

from __future__ import annotations

import argparse
import sys

from agl_bridge import commands, settings


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The parser; its flags are made from the settings' declarations (``agl_bridge.settings``)
    and nothing heavy is imported: no torch, no pyarrow, not the demo."""
    from agl_bridge.trainer.conversion.config import ConvertConfig
    from agl_bridge.trainer.conversion.export_config import ExportConfig
    from agl_bridge.trainer.judging.config import JudgeConfig
    from agl_bridge.trainer.loop.apo.config import ApoConfig
    from agl_bridge.trainer.loop.config import LoopConfig
    from agl_bridge.trainer.loop.demo_config import add_demo_flags
    from agl_bridge.trainer.serving.config import ServeConfig
    from agl_bridge.trainer.training.config import GRPOConfig

    ap = argparse.ArgumentParser(prog="agl-bridge",
                                 description="agl-bridge: the pipeline's stages from the shell.")
    sub = ap.add_subparsers(dest="command", required=True)

    lp = sub.add_parser("loop", help="train, gate, publish and watch, round after round, for "
                                     "any team (the continuous loop)",
                        description="The continuous loop: collect episodes (a team command "
                                    "run on tasks, or a live trace directory), train from the "
                                    "live adapters, gate the candidate on held-out tasks, "
                                    "publish, watch live rewards and roll back. Resumable. "
                                    "The stages' settings are tables of the file ([train], "
                                    "[convert], [judge], [gate], [watch]) and dotted flags "
                                    "(--train.learning-rate).")
    settings.add_file_flags(lp, "loop settings")
    lp.add_argument("--fresh", action="store_true", help="discard an earlier run in workdir")
    lp.add_argument("--metrics-port", type=_port, default=0,
                    help="serve Prometheus metrics (rounds, gate decisions, live versions, "
                         "rollbacks) at http://HOST:PORT/metrics; 0 (default) off")
    lp.add_argument("--metrics-host", default="127.0.0.1",
                    help="address the metrics bind (default 127.0.0.1)")
    settings.add_flags(lp, LoopConfig)
    lp.set_defaults(func=commands.loop)

    rp_ = sub.add_parser("replay", help="play the inputs of stored episodes again, K times "
                                        "each, so production traffic forms groups",
                         description="Run the team command on the first request (captured "
                                     "messages) or a named field of each stored episode, K "
                                     "times: the K episodes share a task id, one group.")
    rp_.add_argument("spans", help="span Parquet of the stored episodes")
    rp_.add_argument("--out", required=True, help="directory for the replayed episodes")
    rp_.add_argument("--base-url", required=True, help="the serving vLLM (OPENAI_BASE_URL)")
    rp_.add_argument("--aliases", help="the alias table the agents resolve (live versions)")
    rp_.add_argument("--max-inputs", type=_positive_int, help="replay the first N at most")
    settings.add_flags(rp_, LoopConfig, only=commands.REPLAY_SETTINGS,
                       defaults=commands.REPLAY_OVERRIDES)
    rp_.set_defaults(func=commands.replay)

    d = sub.add_parser("demo", help="the main job: an AutoGen team of two agents learns from "
                                    "its own traces (closed loop on vLLM)",
                       description="The main job: a closed learning loop that measurably "
                                   "improves a two-agent AutoGen team. A client of the loop: "
                                   "its settings are the loop's (same names), with the demo's "
                                   "own values for its small model as defaults, plus the "
                                   "demo's own. --model: smollm2 or tiny (built locally) or a "
                                   "model directory.")
    add_demo_flags(d)
    d.set_defaults(func=commands.demo)

    c = sub.add_parser("convert", help="span Parquet -> transitions Parquet")
    c.add_argument("spans", help="a span Parquet file or a directory of them")
    c.add_argument("out", help="transitions Parquet file to write")
    settings.add_file_flags(c, "conversion settings")
    settings.add_flags(c, ConvertConfig)
    c.add_argument("--workers", type=_positive_int, default=1,
                   help="processes converting in parallel, each its part of the tasks; OUT "
                        "is then a directory of their parts (trains like one file)")
    c.add_argument("--part", metavar="I/N",
                   help="convert only part I of N (0-based): one machine's share of the "
                        "tasks; a directory of the N outputs trains like one file")
    c.add_argument("--max-rows-in-memory", type=_positive_int, default=100_000,
                   help="past this many span rows, convert bucket by bucket (flat memory)")
    c.set_defaults(func=commands.convert)

    t = sub.add_parser("train", help="convert traces and train LoRA adapters",
                       description="Convert traces (the conversion's settings) and train (the "
                                   "training's settings; TRL's names) new LoRA adapter "
                                   "versions.")
    t.add_argument("traces", help="span Parquet (file or directory), OTLP/JSON, or transitions")
    t.add_argument("--base-model", required=True, help="a local Hugging Face model directory")
    t.add_argument("--adapters-dir", help="where versions are numbered (default: "
                                          "OUTPUT_DIR/adapters); share it between runs")
    t.add_argument("--continue", dest="continue_adapters", action="store_true",
                   help="train each adapter on from its latest version in --adapters-dir")
    t.add_argument("--output-dir", default="agl_bridge_run")
    t.add_argument("--adapter-name", default="policy", help="the shared policy's adapter")
    t.add_argument("--init-adapter", help="continue the shared adapter from this version")
    t.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --output-dir")
    settings.add_file_flags(t, "conversion and training settings, one table")
    settings.add_flags(t, ConvertConfig)
    settings.add_flags(t, GRPOConfig)
    t.set_defaults(func=commands.train)

    x = sub.add_parser("export", help="transitions -> a Hugging Face dataset in the shape TRL's "
                                      "trainers take (sft, dpo, prompt-completion)",
                       description="Write transitions as a Hugging Face dataset: conversational "
                                   "SFT examples (messages, and the ids as input_ids with "
                                   "completion_mask), DPO preference pairs from one group "
                                   "(higher vs lower reward), or prompt-completion rows with "
                                   "rewards. Needs the export extra (datasets). See "
                                   "docs/export.md.")
    x.add_argument("transitions", help="a transitions Parquet file or directory (convert's)")
    x.add_argument("--out", required=True, help="the dataset's directory")
    settings.add_file_flags(x, "export settings")
    settings.add_flags(x, ExportConfig)
    x.set_defaults(func=commands.export)

    def registry_args(parser):
        settings.add_flags(parser, ServeConfig, only=("registry", "max_lora_rank"))
        parser.add_argument("--server", action="append",
                            help="a vLLM base URL (repeat for replicas); default: recorded")
        parser.add_argument("--base-model", help="refuse adapters that do not fit this base")

    p = sub.add_parser("publish", help="validate, load and probe an adapter version, then make "
                                       "it live behind an alias")
    p.add_argument("adapter_dir", help="a versioned adapter directory .../<name>/vN")
    p.add_argument("--alias", help="what agents ask for; without it, only load and probe")
    registry_args(p)
    p.set_defaults(func=commands.publish)

    b = sub.add_parser("rollback", help="make an earlier version of an alias live again")
    b.add_argument("alias")
    b.add_argument("version", help="v5, 5 or alias@v5")
    registry_args(b)
    b.set_defaults(func=commands.rollback)

    v = sub.add_parser("serve", help="start vLLM with runtime LoRA loading, one or more replicas")
    v.add_argument("--model", required=True, help="a local model directory")
    v.add_argument("--served-model-name", default="base",
                   help="the name the base model is served under (default: base)")
    v.add_argument("--replicas", type=_positive_int, default=1, help="servers (default 1)")
    v.add_argument("--port", type=_port, help="first port (default: free ports)")
    settings.add_file_flags(v, "serving settings")
    settings.add_flags(v, ServeConfig)
    v.set_defaults(func=commands.serve)

    s = sub.add_parser("aliases-serve", help="serve the registry's alias and prompt tables "
                                             "over HTTP (/aliases, /prompts), for agents on "
                                             "hosts that do not share its filesystem")
    settings.add_flags(s, ServeConfig, only=("registry",))
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (0.0.0.0: every interface; read-only)")
    s.add_argument("--port", type=int, default=8765)
    s.set_defaults(func=commands.aliases_serve)

    r = sub.add_parser("collect", help="an OTLP receiver (HTTP and gRPC) writing span Parquet",
                       description="Receive OTLP traces over HTTP (protobuf or JSON, POST "
                                   "/v1/traces) and gRPC, write them as span Parquet; OTLP logs "
                                   "too (POST /v1/logs, gRPC LogsService), of which evaluation "
                                   "events (gen_ai.evaluation.result) are kept as rows. Stops "
                                   "cleanly on Ctrl-C or SIGTERM.")
    r.add_argument("--out", required=True, help="directory for the span Parquet")
    r.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    r.add_argument("--http-port", type=_port, default=4318, help="OTLP/HTTP port, 0 disables")
    r.add_argument("--grpc-port", type=_port, default=4317, help="OTLP/gRPC port, 0 disables")
    r.add_argument("--token", help="require 'Authorization: Bearer TOKEN' (prefer the "
                                   "AGL_BRIDGE_COLLECT_TOKEN variable: arguments show in ps)")
    r.add_argument("--max-request-bytes", type=_positive_int, default=16 * 2**20,
                   help="larger requests are refused (HTTP 413, RESOURCE_EXHAUSTED); 16 MiB")
    r.add_argument("--metrics-port", type=_port, default=0,
                   help="serve Prometheus metrics (spans and records received, written, "
                        "quarantined, dropped) at http://HOST:PORT/metrics; 0 (default) off")
    r.set_defaults(func=commands.collect)

    i = sub.add_parser("import", help="OTLP/JSON files (Collector file exporter) -> span Parquet",
                       description="Import OTLP/JSON, one ExportTraceServiceRequest per line "
                                   "(.json, .jsonl, gzip too); ExportLogsServiceRequest lines "
                                   "(resourceLogs) give their evaluation events "
                                   "(gen_ai.evaluation.result). Bad lines are reported as "
                                   "file:line and quarantined; exit status 1 if there were any.")
    i.add_argument("sources", nargs="+", metavar="FILE_OR_DIR")
    i.add_argument("--out", required=True, help="directory for the span Parquet")
    i.set_defaults(func=commands.import_files)

    f = sub.add_parser("feedback", help="import scores that arrived later (CSV, JSON lines, "
                                        "Parquet) into a span directory",
                       description="Import feedback rows (columns id, value; optional name, "
                                   "kind, agent, label, explanation, time) as evaluation "
                                   "records that conversion joins to their episodes. id: an "
                                   "episode id, trace id or gen_ai.response.id. Bad rows are "
                                   "reported as file:line and quarantined; exit status 1 if "
                                   "there were any.")
    f.add_argument("sources", nargs="+", metavar="FILE_OR_DIR")
    f.add_argument("--out", required=True, help="the span Parquet directory to add them to")
    f.set_defaults(func=commands.feedback)

    j = sub.add_parser("judge", help="score episodes with an LLM judge (any OpenAI-compatible "
                                     "server); scores become evaluations in the span store",
                       description="Score the episodes of a span directory against a rubric "
                                   "with an LLM judge and write the scores into it as "
                                   "evaluations named judge:<rubric name> (conversion turns "
                                   "them into rewards). Verdicts are cached in "
                                   "SPANS_DIR/_judge/: a second run asks nothing. Exit status "
                                   "1 if an episode could not be scored or the input had "
                                   "problems (all named). --rubric, --base-url and --model "
                                   "are needed (flags or file). See docs/judges.md.")
    j.add_argument("spans", metavar="SPANS_DIR", help="a span Parquet directory")
    settings.add_file_flags(j, "judge settings")
    settings.add_flags(j, JudgeConfig)
    j.add_argument("--quiet", action="store_true", help="no progress bar")
    j.set_defaults(func=commands.judge)

    o = sub.add_parser("apo", help="optimise agents' system prompts from stored traces: critique, "
                                   "rewrites, held-out scores, gate, publish",
                       description="APO over stored traces: each agent's rewarded episodes are "
                                   "critiqued by an optimizer model (any OpenAI-compatible "
                                   "endpoint), a beam of rewrites is scored by running the team "
                                   "command on held-out tasks with the live prompt swap, and "
                                   "the best is published to the registry's prompt table only "
                                   "if the gate finds it not worse beyond noise. Every "
                                   "candidate's text, score and diff stay in --workdir. See "
                                   "docs/prompts.md.")
    o.add_argument("traces", metavar="SPANS_DIR", help="stored spans with rewarded episodes "
                                                       "(captured at AGL_BRIDGE_CAPTURE=messages,"
                                                       " or pass --tokenizer)")
    o.add_argument("--workdir", required=True, help="where every candidate is kept")
    settings.add_file_flags(o, "apo settings")
    settings.add_flags(o, ApoConfig)
    o.set_defaults(func=commands.apo)

    pr = sub.add_parser("prompts", help="prompt versions in a registry: publish, rollback, "
                                        "history, diff",
                        description="publish AGENT FILE: a new live version of the agent's "
                                    "prompt; rollback AGENT VERSION (p2, 2, writer@p2; p0: the "
                                    "agent's own prompt); history [AGENT]; diff AGENT OLD NEW. "
                                    "Agents follow REGISTRY/prompts.json with "
                                    "AGL_BRIDGE_PROMPTS. See docs/prompts.md.")
    pr.add_argument("action", choices=("publish", "rollback", "history", "diff"))
    pr.add_argument("agent", nargs="?")
    pr.add_argument("values", nargs="*", metavar="FILE_OR_VERSION")
    pr.add_argument("--registry", required=True, help="the registry directory")
    pr.add_argument("--note", help="publish: where this version came from")
    pr.set_defaults(func=commands.prompts)

    v = sub.add_parser("recover", help="turn write-ahead logs left by dead writers into Parquet")
    v.add_argument("directory", help="a span Parquet directory (the one holding _wal/)")
    v.set_defaults(func=commands.recover)

    rp = sub.add_parser("report", help="a training run's metrics -> PNG plots and one HTML page",
                        description="Plot a run's metrics.jsonl (one PNG per panel, one line "
                                    "per adapter) and write report.html, a single "
                                    "self-contained page with a summary table and the plots. "
                                    "Malformed lines are skipped and reported as file:line.")
    rp.add_argument("run", help="a metrics.jsonl file or the directory holding it")
    rp.add_argument("--out", help="output directory (default: report/ beside the metrics file)")
    rp.add_argument("--adapters", action="append", metavar="DIR",
                    help="also list adapter versions found under DIR (default: the run "
                         "directory only); repeatable")
    rp.set_defaults(func=commands.report)
    return ap


# commands that start vLLM: what follows ``--`` are vLLM's own flags, passed as given
VLLM_ARGS = {"serve": "vllm_args", "loop": "serve.vllm_args", "demo": "serve.vllm_args"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = build_parser()
    args = parser.parse_args(argv[:cut])
    if cut < len(argv):
        if args.command not in VLLM_ARGS:
            parser.error(f"{args.command} starts no vLLM: nothing to pass after --")
        setattr(args, VLLM_ARGS[args.command], argv[cut + 1:])
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        print(f"agl-bridge {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
