"""``agl-bridge``: the pipeline's stages from the shell.

    agl-bridge demo                                 the main job: a team learns from its traces
    agl-bridge convert SPANS OUT.parquet            spans -> transitions, with a summary
    agl-bridge train TRACES --base-model DIR        convert and train -> new adapter versions
    agl-bridge report RUN_DIR                       a run's metrics as plots and one HTML page
    agl-bridge serve --model DIR                    vLLM with runtime LoRA (one or more replicas)
    agl-bridge publish ADAPTER_DIR --alias NAME     validate, load, probe, switch the alias
    agl-bridge rollback NAME v5                     an earlier version live again
    agl-bridge collect / import / recover           OTLP in, Collector files in, crash recovery
    agl-bridge collect --out DIR                    an OTLP receiver (HTTP 4318, gRPC 4317)
    agl-bridge import FILES_OR_DIRS --out DIR       OTLP/JSON Collector files -> span Parquet
    agl-bridge recover DIR                          write-ahead logs of dead writers -> Parquet
    agl-bridge report RUN                           metrics.jsonl -> PNG plots and report.html
    agl-bridge judge SPANS --rubric F --base-url U --model M   LLM judge scores -> evaluations

Training imports torch only when ``train`` runs, so the capture install can use ``convert``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path


def _demo(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.loop import demo

    demo.run(args)
    return 0


def _convert(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.conversion import ConvertConfig, convert

    missing = args.missing_reward if args.missing_reward == "drop" else float(args.missing_reward)
    config = ConvertConfig(algorithm=args.algorithm, alpha=args.alpha, gamma=args.gamma,
                           advantage_unit=args.advantage_unit,
                           scale_advantages=not args.no_scale_advantages,
                           missing_reward=missing, retokenize=args.retokenize,
                           evaluation_weights=_weights(args.evaluation, "--evaluation"),
                           evaluation_labels=_weights(args.evaluation_label,
                                                      "--evaluation-label"))

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty() or total > 1:
            end = "\n" if done == total else ""
            print(f"\rconverting: bucket {done}/{total}", end=end, file=sys.stderr, flush=True)

    # this process is ours: convert may switch process-wide allocator settings
    stats = convert(args.spans, args.out, config, max_rows_in_memory=args.max_rows_in_memory,
                    progress=progress, tune_allocators=True)
    print(stats.summary())
    print(f"wrote {args.out}")
    return 0 if stats.transitions else 1

def _train(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.training.from_traces import train_from_traces

    options: dict = {}
    if args.config:
        options.update(_read_config(args.config))
    flags = {"learning_rate": args.learning_rate, "num_train_epochs": args.num_train_epochs,
             "per_device_train_batch_size": args.per_device_train_batch_size,
             "epsilon": args.epsilon, "beta": args.beta, "loss_type": args.loss_type,
             "lora_r": args.lora_r, "seed": args.seed, "save_steps": args.save_steps,
             "max_steps": args.max_steps}
    options.update({k: v for k, v in flags.items() if v is not None})  # flags win over the file
    algorithm = options.pop("algorithm", None) or args.algorithm
    policy = options.pop("policy", None) or args.policy
    init = {args.adapter_name: args.init_adapter} if args.init_adapter else None
    run = train_from_traces(args.traces, args.base_model, algorithm=algorithm, policy=policy,
                            output_dir=args.output_dir, adapter_name=args.adapter_name,
                            init_adapters=init, resume_from_checkpoint=args.resume or None,
                            **options)
    if run.conversion is not None:
        print(run.conversion.summary())
    for name, path in run.adapters.items():
        print(f"adapter {name}: {path}")
    print(f"{run.steps} optimizer steps; metrics: {run.metrics_path}")
    return 0


def _read_config(path: str) -> dict:
    """A JSON or TOML file of options (TRL-style names, plus algorithm and policy)."""
    import json

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    text = open(path, "rb").read()
    try:
        return tomllib.loads(text.decode()) if path.endswith(".toml") else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: not valid {'TOML' if path.endswith('.toml') else 'JSON'}: "
                         f"{exc}") from exc

def _registry_settings(args: argparse.Namespace) -> dict:
    """Servers, base model and rank limit: flags, else what ``agl-bridge serve`` recorded."""
    import json
    from pathlib import Path

    recorded = {}
    config = Path(args.registry) / "servers.json"
    if config.exists():
        recorded = json.loads(config.read_text())
    servers = args.server or recorded.get("servers")
    if not servers:
        raise ValueError(f"no servers: pass --server URL or start them with agl-bridge serve "
                         f"--registry {args.registry}")
    return {"servers": servers,
            "base_model": args.base_model or recorded.get("base_model"),
            "max_lora_rank": args.max_lora_rank or recorded.get("max_lora_rank")}


def _publish(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.serving.publisher import Publisher, publish_adapter

    if args.alias is None:
        if not args.server:
            raise ValueError("pass --alias (with --registry) or --server URL")
        for server in args.server:
            name = publish_adapter(server, args.adapter_dir)
        print(f"published {args.adapter_dir} as {name}")
        return 0
    publisher = Publisher(registry=args.registry, **_registry_settings(args))
    name = publisher.publish(args.adapter_dir, alias=args.alias)
    print(f"published {args.adapter_dir} as {name}; alias {args.alias} -> {name}")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.serving.publisher import Publisher

    publisher = Publisher(registry=args.registry, **_registry_settings(args))
    name = publisher.rollback(args.alias, args.version)
    print(f"alias {args.alias} -> {name}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import json
    import signal
    from pathlib import Path

    from agl_bridge.trainer.serving.vllm_server import VLLMServer

    servers = []
    try:
        for i in range(args.replicas):
            server = VLLMServer(args.model, served_model_name=args.served_model_name,
                                port=(args.port + i) if args.port else None,
                                max_model_len=args.max_model_len, max_lora_rank=args.max_lora_rank,
                                max_loras=args.max_loras,
                                log_path=Path(args.registry) / f"vllm-{i}.log")
            Path(args.registry).mkdir(parents=True, exist_ok=True)
            servers.append(server.start())
            print(f"replica {i}: {server.base_url} (model {args.served_model_name})", flush=True)
        (Path(args.registry) / "servers.json").write_text(json.dumps({
            "servers": [s.base_url for s in servers], "base_model": str(Path(args.model).resolve()),
            "max_lora_rank": args.max_lora_rank}, indent=2))
        print(f"registry {args.registry}: agents set AGL_BRIDGE_ALIASES="
              f"{Path(args.registry).resolve() / 'aliases.json'}; Ctrl-C stops", flush=True)
        signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        for server in servers:
            server.stop()
    return 0


def _collect(args: argparse.Namespace) -> int:
    from agl_bridge.otel.parquet_writer import SpanParquetWriter
    from agl_bridge.otel.receiver import TOKEN_ENV, OTLPReceiver

    http_port, grpc_port = args.http_port or None, args.grpc_port or None  # 0 disables
    if http_port is None and grpc_port is None:
        raise ValueError("--http-port 0 and --grpc-port 0: nothing to serve")
    token = args.token or os.environ.get(TOKEN_ENV) or None
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        writer = SpanParquetWriter(args.out)
        receiver = OTLPReceiver(writer, host=args.host, http_port=http_port,
                                grpc_port=grpc_port, token=token,
                                max_request_bytes=args.max_request_bytes)
        try:
            receiver.start()
        except BaseException:
            writer.close()
            raise
        print(f"agl-bridge collect: writing span Parquet under {writer.directory}"
              + (f" (recovered {writer.recovered_rows} rows)" if writer.recovered_rows else ""))
        if receiver.http_endpoint:
            print(f"  OTLP/HTTP  {receiver.http_endpoint}")
        if receiver.grpc_endpoint:
            print(f"  OTLP/gRPC  {receiver.grpc_endpoint}")
        if token:
            print("  requests need 'Authorization: Bearer <token>'")
        elif args.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"agl-bridge collect: warning: listening on {args.host} without a token: anyone "
                  f"who reaches it can write spans (set --token or {TOKEN_ENV})", file=sys.stderr)
        print("Ctrl-C or SIGTERM stops and turns the logs into Parquet files.", flush=True)
        while not stop.wait(1.0):
            pass
        receiver.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(f"agl-bridge collect: stopped; {receiver.stats.summary()}; "
          f"{writer.files_written} Parquet file(s) written", flush=True)
    return 0


def _import(args: argparse.Namespace) -> int:
    from agl_bridge.otel.parquet_writer import SpanParquetWriter
    from agl_bridge.otel.receiver import import_otlp_json, otlp_json_files

    # refuse missing or unreadable inputs before writing anything
    otlp_json_files(args.sources, exclude=Path(args.out))
    writer = SpanParquetWriter(args.out, background_rotation=False)
    try:
        summary = import_otlp_json(args.sources, writer,
                                   on_bad_line=lambda msg: print(msg, file=sys.stderr))
    finally:
        writer.close()
    print(summary.summary())
    print(f"wrote {writer.files_written} Parquet file(s) under {writer.directory}")
    return 1 if summary.lines_bad or summary.spans_rejected else 0


def _feedback(args: argparse.Namespace) -> int:
    from agl_bridge.otel.feedback_files import import_feedback

    summary = import_feedback(args.sources, args.out)
    for line in summary.bad:
        print(line, file=sys.stderr)
    if summary.bad_count > len(summary.bad):
        print(f"... and {summary.bad_count - len(summary.bad)} more bad row(s)", file=sys.stderr)
    print(f"{summary.imported} of {summary.rows} feedback row(s) from {summary.files} file(s) "
          f"imported into {args.out}" + (f"; {summary.bad_count} bad (quarantined)"
                                          if summary.bad_count else ""))
    return 1 if summary.bad_count else 0


def _judge(args: argparse.Namespace) -> int:
    import json

    from agl_bridge.trainer.judging import judge_spans

    extra = None
    if args.extra_body:
        try:
            extra = json.loads(args.extra_body)
        except ValueError:
            extra = None
        if not isinstance(extra, dict):
            raise ValueError(f"--extra-body {args.extra_body!r}: expected a JSON object")
    summary = judge_spans(args.spans, args.rubric, base_url=args.base_url, model=args.model,
                          mode=args.mode, tokenizer=args.tokenizer,
                          concurrency=args.concurrency, retries=args.retries,
                          max_episodes=args.max_episodes, timeout_s=args.timeout,
                          temperature=args.temperature, max_tokens=args.max_tokens,
                          structured=args.structured, extra_body=extra,
                          progress=not args.quiet)
    for problem in summary.problems[:50]:
        print(f"agl-bridge judge: {problem}", file=sys.stderr)
    if len(summary.problems) > 50:
        print(f"agl-bridge judge: ... and {len(summary.problems) - 50} more problem(s)",
              file=sys.stderr)
    print(summary.summary())
    return 1 if summary.failed or summary.problems else 0


def _weights(pairs: list[str] | None, what: str) -> dict[str, float] | None:
    """``NAME=NUMBER`` pairs (``--evaluation helpful=1``) as a mapping, checked."""
    if not pairs:
        return None
    out = {}
    for pair in pairs:
        name, sep, number = pair.rpartition("=")
        try:
            value = float(number)
        except ValueError:
            value = float("nan")
        if not sep or not name or value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{what} {pair!r}: expected NAME=NUMBER")
        out[name] = value
    return out


def _recover(args: argparse.Namespace) -> int:
    from agl_bridge.otel.parquet_writer import SpanParquetWriter

    if not os.path.isdir(args.directory):
        raise FileNotFoundError(f"no such directory: {args.directory}")
    rows = SpanParquetWriter.recover(args.directory)
    print(f"recovered {rows} row(s) from write-ahead logs of dead writers in {args.directory}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.training.report import report

    html_path, summary, problems = report(args.run, args.out, args.adapters or ())
    for problem in problems:
        print(f"agl-bridge report: skipped {problem}", file=sys.stderr)
    print(f"{summary['micro_batches']} micro-batches, {summary['steps']} optimizer steps, "
          f"{len(summary['adapters'])} adapter(s); {summary['malformed']} malformed line(s) "
          f"skipped")
    print(f"wrote {html_path} (and the panels as PNG beside it)")
    return 0


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
    ap = argparse.ArgumentParser(prog="agl-bridge", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    from agl_bridge.trainer.loop import demo

    d = sub.add_parser("demo", help="the main job: an AutoGen team of two agents learns from "
                                    "its own traces (closed loop on vLLM)",
                       description=demo.__doc__.splitlines()[0])
    demo.build_parser(d)
    d.set_defaults(func=_demo)

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
    c.add_argument("--retokenize", metavar="TOKENIZER_DIR",
                   help="rebuild ids from captured messages for spans without them (flagged), "
                        "and count disagreements with recorded ids")
    c.add_argument("--max-rows-in-memory", type=int, default=100_000,
                   help="past this many span rows, convert bucket by bucket (flat memory)")
    c.add_argument("--evaluation", action="append", metavar="NAME=WEIGHT",
                   help="count evaluations (feedback, gen_ai.evaluation.result, judges) named "
                        "NAME with this weight; repeatable. Unset: every name, weight 1; once "
                        "set, only the names given")
    c.add_argument("--evaluation-label", action="append", metavar="LABEL=VALUE",
                   help="score label-only evaluations (e.g. pass=1, fail=0); repeatable")
    c.set_defaults(func=_convert)

    t = sub.add_parser("train", help="convert traces and train LoRA adapters")
    t.add_argument("traces", help="span Parquet (file or directory), OTLP/JSON, or transitions")
    t.add_argument("--base-model", required=True, help="a local Hugging Face model directory")
    t.add_argument("--algorithm", choices=["at_grpo", "lightning_rl"], default="at_grpo")
    t.add_argument("--policy", choices=["shared", "per_agent_lora", "per_agent_model"],
                   default="shared")
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
    t.add_argument("--save-steps", type=int, help="checkpoint every N optimizer steps")
    t.add_argument("--max-steps", type=int, help="stop after N optimizer steps")
    t.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --output-dir")
    t.set_defaults(func=_train)

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
    p.set_defaults(func=_publish)

    b = sub.add_parser("rollback", help="make an earlier version of an alias live again")
    b.add_argument("alias")
    b.add_argument("version", help="v5, 5 or alias@v5")
    registry_args(b)
    b.set_defaults(func=_rollback)

    v = sub.add_parser("serve", help="start vLLM with runtime LoRA loading, one or more replicas")
    v.add_argument("--model", required=True, help="a local model directory")
    v.add_argument("--served-model-name", default="base")
    v.add_argument("--replicas", type=int, default=1)
    v.add_argument("--port", type=int, help="first port (default: free ports)")
    v.add_argument("--max-model-len", type=int, default=1024)
    v.add_argument("--max-lora-rank", type=int, default=16)
    v.add_argument("--max-loras", type=int, default=4)
    v.add_argument("--registry", default="agl_bridge_registry")
    v.set_defaults(func=_serve)

    r = sub.add_parser("collect", help="an OTLP receiver (HTTP and gRPC) writing span Parquet",
                       description="Receive OTLP traces over HTTP (protobuf or JSON, POST "
                                   "/v1/traces) and gRPC, write them as span Parquet. Stops "
                                   "cleanly on Ctrl-C or SIGTERM.")
    r.add_argument("--out", required=True, help="directory for the span Parquet")
    r.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    r.add_argument("--http-port", type=_port, default=4318, help="OTLP/HTTP port, 0 disables")
    r.add_argument("--grpc-port", type=_port, default=4317, help="OTLP/gRPC port, 0 disables")
    r.add_argument("--token", help="require 'Authorization: Bearer TOKEN' (prefer the "
                                   "AGL_BRIDGE_COLLECT_TOKEN variable: arguments show in ps)")
    r.add_argument("--max-request-bytes", type=_positive_int, default=16 * 2**20,
                   help="larger requests are refused (HTTP 413, RESOURCE_EXHAUSTED); 16 MiB")
    r.set_defaults(func=_collect)

    i = sub.add_parser("import", help="OTLP/JSON files (Collector file exporter) -> span Parquet",
                       description="Import OTLP/JSON, one ExportTraceServiceRequest per line "
                                   "(.json, .jsonl, gzip too). Bad lines are reported as "
                                   "file:line and quarantined; exit status 1 if there were any.")
    i.add_argument("sources", nargs="+", metavar="FILE_OR_DIR")
    i.add_argument("--out", required=True, help="directory for the span Parquet")
    i.set_defaults(func=_import)

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
    f.set_defaults(func=_feedback)

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
    j.set_defaults(func=_judge)

    v = sub.add_parser("recover", help="turn write-ahead logs left by dead writers into Parquet")
    v.add_argument("directory", help="a span Parquet directory (the one holding _wal/)")
    v.set_defaults(func=_recover)

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
    rp.set_defaults(func=_report)
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
