"""``agl-bridge``: the pipeline's stages from the shell.

    agl-bridge demo                                 the main job: a team learns from its traces
    agl-bridge loop --config loop.toml              train, gate, publish, watch: any team
    agl-bridge convert SPANS OUT.parquet            spans -> transitions, with a summary
    agl-bridge train TRACES --base-model DIR        convert and train -> new adapter versions
    agl-bridge report RUN_DIR                       a run's metrics as plots and one HTML page
    agl-bridge serve --model DIR                    vLLM with runtime LoRA (one or more replicas)
    agl-bridge publish ADAPTER_DIR --alias NAME     validate, load, probe, switch the alias
    agl-bridge rollback NAME v5                     an earlier version live again
    agl-bridge collect --out DIR                    an OTLP receiver (HTTP 4318, gRPC 4317)
    agl-bridge import FILES_OR_DIRS --out DIR       OTLP/JSON Collector files -> span Parquet
    agl-bridge recover DIR                          write-ahead logs of dead writers -> Parquet
    agl-bridge feedback FILE --out DIR              scores that arrived later -> span Parquet
    agl-bridge judge SPANS --rubric F --base-url U --model M   LLM judge scores -> evaluations

Training imports torch only when ``train`` runs, so the capture install can use ``convert``.
"""

from __future__ import annotations

import argparse
import sys

from agl_bridge import commands
from agl_bridge.trainer.training.config import SFT_SELECTS, TRAIN_ALGORITHMS


def _loop_args(parser: argparse.ArgumentParser) -> None:
    """Every LoopConfig setting as a flag (help from its comment in config.py)."""
    import dataclasses

    from agl_bridge.trainer.loop.config import LoopConfig, setting_help

    parser.add_argument("--config", help="a TOML or JSON file of these settings (flags win)")
    parser.add_argument("--fresh", action="store_true", help="discard an earlier run in workdir")
    helps = setting_help()
    for f in dataclasses.fields(LoopConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        kind = type(default) if default is not None and not isinstance(default, bool) else str
        if f.name == "agents":
            parser.add_argument(flag, dest=f"loop_{f.name}", nargs="+", metavar="ALIAS",
                                help=helps.get(f.name))
        elif isinstance(default, bool):
            parser.add_argument(flag, dest=f"loop_{f.name}", action="store_true", default=None,
                                help=helps.get(f.name))
        else:
            parser.add_argument(flag, dest=f"loop_{f.name}", type=kind, metavar=f.name.upper(),
                                help=f"{helps.get(f.name, '')} (default: {default})")


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


def baseline_args(parser: argparse.ArgumentParser, default: str | None = "group") -> None:
    parser.add_argument("--baseline", default=default, metavar="group|batch|key:ATTR[,...]",
                        help="what rewards are compared with, first that applies: group (the "
                             "rollouts of the same task; default), batch (the same agent and "
                             "turn over the whole output: for traffic that never repeats), "
                             "key:ATTRIBUTE (leave-one-out over episodes sharing that "
                             "attribute), e.g. group,batch")
    parser.add_argument("--per-agent-advantages", action="store_true", default=None,
                        help="normalise with each agent's own statistics (Dr. MAS)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="agl-bridge",
                                 description="agl-bridge: the pipeline's stages from the shell.")
    sub = ap.add_subparsers(dest="command", required=True)

    from agl_bridge.trainer.loop import demo

    lp = sub.add_parser("loop", help="train, gate, publish and watch, round after round, for "
                                     "any team (the continuous loop)",
                        description="The continuous loop: collect episodes (a team command "
                                    "run on tasks, or a live trace directory), train from the "
                                    "live adapters, gate the candidate on held-out tasks, "
                                    "publish, watch live rewards and roll back. Resumable.")
    _loop_args(lp)
    lp.set_defaults(func=commands.loop)

    rp_ = sub.add_parser("replay", help="play the inputs of stored episodes again, K times "
                                        "each, so production traffic forms groups",
                         description="Run the team command on the first request (captured "
                                     "messages) or a named field of each stored episode, K "
                                     "times: the K episodes share a task id, one group.")
    rp_.add_argument("spans", help="span Parquet of the stored episodes")
    rp_.add_argument("--team", required=True, help="the team command (its own program, "
                                                   "configured by environment)")
    rp_.add_argument("--out", required=True, help="directory for the replayed episodes")
    rp_.add_argument("--base-url", required=True, help="the serving vLLM (OPENAI_BASE_URL)")
    rp_.add_argument("--aliases", help="the alias table the agents resolve (live versions)")
    rp_.add_argument("-k", type=_positive_int, default=4, help="episodes per input (default 4)")
    rp_.add_argument("--temperature", type=float, default=1.0)
    rp_.add_argument("--field", help="also give the team this span column or attribute")
    rp_.add_argument("--max-inputs", type=_positive_int, help="replay at most this many")
    rp_.set_defaults(func=commands.replay)

    d = sub.add_parser("demo", help="the main job: an AutoGen team of two agents learns from "
                                    "its own traces (closed loop on vLLM)",
                       description=demo.__doc__.splitlines()[0])
    demo.build_parser(d)
    d.set_defaults(func=commands.demo)

    c = sub.add_parser("convert", help="span Parquet -> transitions Parquet")
    c.add_argument("spans", help="a span Parquet file or a directory of them")
    c.add_argument("out", help="transitions Parquet file to write")
    c.add_argument("--missing-reward", default="drop",
                   help="'drop' episodes without a reward (default) or a number to give them")
    c.add_argument("--algorithm", choices=["at_grpo", "lightning_rl"], default="at_grpo",
                   help="credit and groups: AT-GRPO (task, agent, turn) or LightningRL (task)")
    c.add_argument("--alpha", type=float, default=1.0,
                   help="AT-GRPO: reward = alpha * team + local (default 1)")
    c.add_argument("--gamma", type=float, default=1.0,
                   help="discount of the team reward over an agent's turns (default 1: none)")
    c.add_argument("--advantage-unit", choices=["transition", "rollout"], default="transition",
                   help="what counts once in a group's mean and std")
    c.add_argument("--no-scale-advantages", action="store_true",
                   help="mean-centre only (Dr. GRPO), do not divide by the std")
    baseline_args(c)
    c.add_argument("--retokenize", metavar="TOKENIZER_DIR",
                   help="rebuild ids from captured messages for spans without them (flagged), "
                        "and count disagreements with recorded ids")
    c.add_argument("--workers", type=int, default=1,
                   help="processes converting in parallel, each its part of the tasks; OUT "
                        "is then a directory of their parts (trains like one file)")
    c.add_argument("--part", metavar="I/N",
                   help="convert only part I of N (0-based): one machine's share of the "
                        "tasks; a directory of the N outputs trains like one file")
    c.add_argument("--max-rows-in-memory", type=int, default=100_000,
                   help="past this many span rows, convert bucket by bucket (flat memory)")
    c.add_argument("--rewards", metavar="RECIPE.toml",
                   help="a reward recipe: rewards derived from what the spans hold (tool "
                        "failures, votes, DAG tasks, cost) and which evaluations count")
    c.add_argument("--evaluation", action="append", metavar="NAME=WEIGHT",
                   help="count evaluations (feedback, gen_ai.evaluation.result, judges) named "
                        "NAME with this weight; repeatable. Unset: every name, weight 1; once "
                        "set, only the names given")
    c.add_argument("--evaluation-label", action="append", metavar="LABEL=VALUE",
                   help="score label-only evaluations (e.g. pass=1, fail=0); repeatable")
    c.set_defaults(func=commands.convert)

    t = sub.add_parser("train", help="convert traces and train LoRA adapters")
    t.add_argument("traces", help="span Parquet (file or directory), OTLP/JSON, or transitions")
    t.add_argument("--base-model", required=True, help="a local Hugging Face model directory")
    t.add_argument("--algorithm", choices=TRAIN_ALGORITHMS,
                   help="default at_grpo (or the --config file's); sft: supervised fine-tuning "
                        "on the best of each group (--sft-select, --sft-min-reward)")
    t.add_argument("--sft-select", choices=SFT_SELECTS,
                   help="sft: imitate the best of each group (default), or every transition "
                        "with reward >= --sft-min-reward")
    t.add_argument("--sft-min-reward", type=float,
                   help="sft: the reward a transition (threshold) or a group's best must reach")
    t.add_argument("--policy", choices=["shared", "per_agent_lora", "per_agent_model"],
                   help="default shared (or the --config file's)")
    t.add_argument("--adapters-dir", help="where versions are numbered (default: "
                                          "OUTPUT_DIR/adapters); share it between runs")
    t.add_argument("--continue", dest="continue_adapters", action="store_true",
                   help="train each adapter on from its latest version in --adapters-dir")
    t.add_argument("--output-dir", default="agl_bridge_run")
    t.add_argument("--adapter-name", default="policy", help="the shared policy's adapter")
    t.add_argument("--init-adapter", help="continue the shared adapter from this version")
    t.add_argument("--config", help="JSON or TOML file of options (TRL-style names)")
    t.add_argument("--learning-rate", type=float)
    t.add_argument("--num-train-epochs", type=int)
    t.add_argument("--per-device-train-batch-size", type=int)
    t.add_argument("--epsilon", type=float)
    t.add_argument("--beta", type=float, help="KL weight (k3, reference = adapter disabled)")
    t.add_argument("--loss-type", choices=["grpo", "bnpo", "dapo", "dr_grpo"])
    t.add_argument("--lora-r", type=int)
    t.add_argument("--seed", type=int)
    t.add_argument("--gradient-accumulation-steps", type=int)
    t.add_argument("--parallelism", choices=["data", "fsdp"],
                   help="under torchrun: data parallel (default; every rank holds the model) "
                        "or FSDP2 (the model's blocks sharded over the ranks)")
    t.add_argument("--save-steps", type=int, help="checkpoint every N optimizer steps")
    t.add_argument("--max-steps", type=int, help="stop after N optimizer steps")
    baseline_args(t, default=None)
    t.add_argument("--rewards", metavar="RECIPE.toml",
                   help="a reward recipe applied at conversion (see agl-bridge convert)")
    t.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --output-dir")
    t.set_defaults(func=commands.train)

    def registry_args(parser):
        parser.add_argument("--registry", default="agl_bridge_registry",
                            help="alias table, history and recorded servers")
        parser.add_argument("--server", action="append",
                            help="a vLLM base URL (repeat for replicas); default: recorded")
        parser.add_argument("--base-model", help="refuse adapters that do not fit this base")
        parser.add_argument("--max-lora-rank", type=int, help="the servers' --max-lora-rank")

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
    v.add_argument("--served-model-name", default="base")
    v.add_argument("--replicas", type=int, default=1)
    v.add_argument("--port", type=int, help="first port (default: free ports)")
    v.add_argument("--max-model-len", type=int, default=1024)
    v.add_argument("--max-lora-rank", type=int, default=16)
    v.add_argument("--max-loras", type=int, default=4)
    v.add_argument("--registry", default="agl_bridge_registry")
    v.set_defaults(func=commands.serve)

    s = sub.add_parser("aliases-serve", help="serve the registry's alias table over HTTP, for "
                                             "agents on hosts that do not share its filesystem")
    s.add_argument("--registry", default="agl_bridge_registry")
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
                                   "problems (all named). See docs/judges.md.")
    j.add_argument("spans", metavar="SPANS_DIR", help="a span Parquet directory")
    j.add_argument("--rubric", required=True, metavar="FILE",
                   help="TOML (name, instructions, scale = [low, high]) or plain text")
    j.add_argument("--base-url", required=True, metavar="URL",
                   help="the judge's OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 "
                        "(API key: $OPENAI_API_KEY)")
    j.add_argument("--model", required=True, metavar="NAME", help="the judge model's name there")
    j.add_argument("--mode", choices=["absolute", "relative"], default="absolute",
                   help="absolute: each episode alone; relative: the episodes of one task "
                        "together, on one scale (RULER-style)")
    j.add_argument("--tokenizer", metavar="DIR",
                   help="the served model's tokenizer, to read episodes captured with token "
                        "ids only")
    j.add_argument("--concurrency", type=_positive_int, default=4,
                   help="requests in flight (default 4)")
    j.add_argument("--retries", type=int, default=2,
                   help="asks again after an unparsable verdict or a transient error "
                        "(default 2)")
    j.add_argument("--max-episodes", type=_positive_int, metavar="N",
                   help="judge at most N episodes (relative mode never splits a group)")
    j.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    j.add_argument("--temperature", type=float, default=0.0,
                   help="the first ask's temperature (retries use at least 0.7)")
    j.add_argument("--max-tokens", type=_positive_int,
                   help="per answer (default 400; relative: 150 + 100 per episode)")
    j.add_argument("--structured", action="store_true",
                   help="ask for the verdict's JSON schema as response_format (vLLM, OpenAI)")
    j.add_argument("--extra-body", metavar="JSON",
                   help="more request fields, merged into every request (e.g. vLLM's "
                        "'{\"structured_outputs\": {\"regex\": \"...\"}}')")
    j.add_argument("--quiet", action="store_true", help="no progress bar")
    j.set_defaults(func=commands.judge)

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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        print(f"agl-bridge {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
