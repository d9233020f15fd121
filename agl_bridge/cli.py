"""``agl-bridge``: the pipeline's stages from the shell.

    agl-bridge convert SPANS_DIR OUT.parquet        spans -> transitions, with a summary
    agl-bridge train OUT.parquet --base-model DIR   one GRPO round -> a new adapter version
    agl-bridge publish ADAPTER_DIR --base-url URL   load it into a running vLLM and probe it
    agl-bridge collect --out DIR                    an OTLP receiver (HTTP 4318, gRPC 4317)
    agl-bridge import FILES_OR_DIRS --out DIR       OTLP/JSON Collector files -> span Parquet
    agl-bridge recover DIR                          write-ahead logs of dead writers -> Parquet
    agl-bridge report RUN                           metrics.jsonl -> PNG plots and report.html

Training imports torch only when ``train`` runs, so the capture install can use ``convert``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path


def _convert(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.transitions import ConvertConfig, convert

    missing = args.missing_reward if args.missing_reward == "drop" else float(args.missing_reward)
    config = ConvertConfig(algorithm=args.algorithm, alpha=args.alpha, gamma=args.gamma,
                           advantage_unit=args.advantage_unit,
                           scale_advantages=not args.no_scale_advantages,
                           missing_reward=missing, retokenize=args.retokenize)

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty() or total > 1:
            end = "\n" if done == total else ""
            print(f"\rconverting: bucket {done}/{total}", end=end, file=sys.stderr, flush=True)

    stats = convert(args.spans, args.out, config, max_rows_in_memory=args.max_rows_in_memory,
                    progress=progress)
    print(stats.summary())
    print(f"wrote {args.out}")
    return 0 if stats.transitions else 1

def _train(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.api import train_from_traces

    options: dict = {}
    if args.config:
        options.update(_read_config(args.config))
    flags = {"learning_rate": args.learning_rate, "num_train_epochs": args.num_train_epochs,
             "per_device_train_batch_size": args.per_device_train_batch_size,
             "epsilon": args.epsilon, "beta": args.beta, "loss_type": args.loss_type,
             "lora_r": args.lora_r, "seed": args.seed}
    options.update({k: v for k, v in flags.items() if v is not None})  # flags win over the file
    algorithm = options.pop("algorithm", None) or args.algorithm
    policy = options.pop("policy", None) or args.policy
    init = {args.adapter_name: args.init_adapter} if args.init_adapter else None
    run = train_from_traces(args.traces, args.base_model, algorithm=algorithm, policy=policy,
                            output_dir=args.output_dir, adapter_name=args.adapter_name,
                            init_adapters=init, **options)
    if run.conversion is not None:
        print(run.conversion.summary())
    for name, path in run.adapters.items():
        print(f"adapter {name}: {path}")
    print(f"{run.steps} optimizer steps; metrics: {run.metrics_path}")
    return 0


def _read_config(path: str) -> dict:
    """A JSON or TOML file of options (TRL-style names, plus algorithm and policy)."""
    import json
    import tomllib

    text = open(path, "rb").read()
    try:
        return tomllib.loads(text.decode()) if path.endswith(".toml") else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: not valid {'TOML' if path.endswith('.toml') else 'JSON'}: "
                         f"{exc}") from exc

def _publish(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.publish import publish_adapter

    name = publish_adapter(args.base_url, args.adapter_dir, name=args.name)
    print(f"published {args.adapter_dir} as {name}")
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


def _recover(args: argparse.Namespace) -> int:
    from agl_bridge.otel.parquet_writer import SpanParquetWriter

    if not os.path.isdir(args.directory):
        raise FileNotFoundError(f"no such directory: {args.directory}")
    rows = SpanParquetWriter.recover(args.directory)
    print(f"recovered {rows} row(s) from write-ahead logs of dead writers in {args.directory}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.report import report

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
    c.add_argument("--max-rows-in-memory", type=int, default=500_000,
                   help="past this many span rows, convert bucket by bucket (flat memory)")
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
    t.set_defaults(func=_train)

    p = sub.add_parser("publish", help="load an adapter version into a running vLLM")
    p.add_argument("adapter_dir")
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--name", help="served name (default: <adapter name>@v<N>)")
    p.set_defaults(func=_publish)

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
