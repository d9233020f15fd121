"""What each ``agl-bridge`` command does (``cli.py`` builds the parser and dispatches here).

Each function takes the parsed arguments and returns the exit status. Heavy modules (torch,
pyarrow, vLLM) are imported inside the command that needs them, so ``agl-bridge --help`` and
the capture-only install stay light.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from agl_bridge.trainer.rewards.credit import Algorithm
    from agl_bridge.trainer.training.config import Policy


def loop(args: argparse.Namespace) -> int:
    import dataclasses

    from agl_bridge.trainer.loop.config import LoopConfig, read_config
    from agl_bridge.trainer.loop.engine import Loop

    values = read_config(args.config) if args.config else {}
    for f in dataclasses.fields(LoopConfig):
        given = getattr(args, f"loop_{f.name}", None)
        if given is not None:
            values[f.name] = given  # flags win over the file
    cfg = LoopConfig.from_mapping(values, args.config or "flags")
    data = Loop(cfg, fresh=args.fresh).run()
    from agl_bridge.trainer.loop.summary import write_summary

    print(write_summary(cfg.work, data))
    return 0


def replay(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.loop.replay import replay

    inputs, run = replay(args.spans, args.team, Path(args.out), base_url=args.base_url,
                         aliases=Path(args.aliases) if args.aliases else None, k=args.k,
                         temperature=args.temperature, field_name=args.field,
                         limit=args.max_inputs)
    for episode in inputs.without_input[:20]:
        print(f"episode {episode}: no captured request messages"
              + (f" and no {args.field!r}" if args.field else "") + " (not replayed)",
              file=sys.stderr)
    print(f"{len(inputs.tasks)} of {inputs.episodes} stored episode(s) replayed x {args.k}"
          + (f" -> {run.spans}" if run else ""))
    return 0 if run else 1


def demo(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.loop import demo

    demo.run(args)
    return 0


def convert(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.conversion import ConvertConfig, convert

    missing = args.missing_reward if args.missing_reward == "drop" else float(args.missing_reward)
    config = ConvertConfig(algorithm=args.algorithm, alpha=args.alpha, gamma=args.gamma,
                           advantage_unit=args.advantage_unit,
                           scale_advantages=not args.no_scale_advantages,
                           missing_reward=missing, retokenize=args.retokenize,
                           evaluation_weights=weights(args.evaluation, "--evaluation"),
                           evaluation_labels=weights(args.evaluation_label,
                                                      "--evaluation-label"),
                           recipe=recipe(args.rewards), baseline=args.baseline,
                           per_agent_advantages=bool(args.per_agent_advantages))

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty() or total > 1:
            end = "\n" if done == total else ""
            print(f"\rconverting: bucket {done}/{total}", end=end, file=sys.stderr, flush=True)

    if args.workers > 1 and args.part:
        raise SystemExit("agl-bridge convert: --workers and --part are exclusive (a part is "
                         "one process's share)")
    if args.workers > 1:
        from agl_bridge.trainer.conversion.parallel import convert_parallel

        def done(i: int, _stats) -> None:
            print(f"converting: part {i} of {args.workers} done", file=sys.stderr, flush=True)

        stats = convert_parallel(args.spans, args.out, config, workers=args.workers,
                                 max_rows_in_memory=args.max_rows_in_memory, on_part=done)
    else:
        from agl_bridge.trainer.conversion.partition import parse_part

        part = parse_part(args.part) if args.part else None
        # this process is ours: convert may switch process-wide allocator settings
        stats = convert(args.spans, args.out, config,
                        max_rows_in_memory=args.max_rows_in_memory, progress=progress,
                        tune_allocators=True, part=part)
    print(stats.summary())
    print(f"wrote {args.out}" + (f" ({args.workers} parts: a transitions directory)"
                                 if args.workers > 1 else ""))
    return 0 if stats.transitions else 1


def train(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.training.from_traces import train_from_traces

    options: dict = {}
    if args.config:
        options.update(read_config(args.config))
    flags = {"learning_rate": args.learning_rate, "num_train_epochs": args.num_train_epochs,
             "per_device_train_batch_size": args.per_device_train_batch_size,
             "epsilon": args.epsilon, "beta": args.beta, "loss_type": args.loss_type,
             "lora_r": args.lora_r, "seed": args.seed, "save_steps": args.save_steps,
             "max_steps": args.max_steps, "baseline": args.baseline,
             "sft_select": args.sft_select, "sft_min_reward": args.sft_min_reward,
             "per_agent_advantages": args.per_agent_advantages,
             "gradient_accumulation_steps": args.gradient_accumulation_steps,
             "parallelism": args.parallelism}
    options.update({k: v for k, v in flags.items() if v is not None})  # flags win over the file
    # flags win over the file, which wins over the defaults
    algorithm = args.algorithm or options.pop("algorithm", None) or "at_grpo"
    policy = args.policy or options.pop("policy", None) or "shared"
    options.pop("algorithm", None)
    options.pop("policy", None)
    init = {args.adapter_name: args.init_adapter} if args.init_adapter else {}
    if args.continue_adapters:  # every adapter from its latest version in --adapters-dir
        from agl_bridge.trainer.adapters import latest_adapter

        root = Path(args.adapters_dir or Path(args.output_dir) / "adapters")
        for d in sorted(root.iterdir()) if root.is_dir() else []:
            latest = latest_adapter(root, d.name)
            if latest is not None:
                init.setdefault(d.name, str(latest))
    run = train_from_traces(args.traces, args.base_model, algorithm=cast("Algorithm", algorithm),
                            policy=cast("Policy", policy),
                            output_dir=args.output_dir, adapter_name=args.adapter_name,
                            init_adapters=init or None,
                            resume_from_checkpoint=args.resume or None,
                            adapters_dir=args.adapters_dir, rewards=args.rewards, **options)
    if run.conversion is not None:
        print(run.conversion.summary())
    for name, path in run.adapters.items():
        print(f"adapter {name}: {path}")
    print(f"{run.steps} optimizer steps; metrics: {run.metrics_path}")
    return 0


def read_config(path: str) -> dict:
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


def registry_settings(args: argparse.Namespace) -> dict:
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


def publish(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.serving.publisher import Publisher, publish_adapter

    if args.alias is None:
        if not args.server:
            raise ValueError("pass --alias (with --registry) or --server URL")
        for server in args.server:
            name = publish_adapter(server, args.adapter_dir)
        print(f"published {args.adapter_dir} as {name}")
        return 0
    publisher = Publisher(registry=args.registry, **registry_settings(args))
    name = publisher.publish(args.adapter_dir, alias=args.alias)
    live = publisher.live(args.alias)
    if live == name:
        print(f"published {args.adapter_dir} as {name}; alias {args.alias} -> {name}")
    else:  # versions go live in order: a newer one was live already
        print(f"published {args.adapter_dir} as {name}; alias {args.alias} stays on the newer "
              f"{live} (agl-bridge rollback {args.alias} {name} makes {name} live)")
    return 0


def rollback(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.serving.publisher import Publisher

    publisher = Publisher(registry=args.registry, **registry_settings(args))
    name = publisher.rollback(args.alias, args.version)
    print(f"alias {args.alias} -> {name}")
    return 0


def aliases_serve(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.serving.alias_server import AliasServer

    server = AliasServer(args.registry, args.host, args.port)
    print(f"alias table {Path(args.registry).resolve() / 'aliases.json'} at {server.url}: "
          f"agents set AGL_BRIDGE_ALIASES={server.url}; Ctrl-C stops", flush=True)
    signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0


def serve(args: argparse.Namespace) -> int:
    import json
    import signal
    from pathlib import Path

    from agl_bridge.trainer.serving.vllm_server import VLLMServer, cpu_share

    servers = []
    try:
        for i in range(args.replicas):
            server = VLLMServer(args.model, served_model_name=args.served_model_name,
                                port=(args.port + i) if args.port else None,
                                max_model_len=args.max_model_len, max_lora_rank=args.max_lora_rank,
                                max_loras=args.max_loras,
                                log_path=Path(args.registry) / f"vllm-{i}.log",
                                cpu_cores=cpu_share(i, args.replicas) if args.replicas > 1
                                else None)
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


def collect(args: argparse.Namespace) -> int:
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
            print(f"  OTLP/HTTP  {receiver.logs_endpoint}  (evaluation events)")
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


def import_files(args: argparse.Namespace) -> int:
    from agl_bridge.otel.collector_files import import_otlp_json, otlp_json_files
    from agl_bridge.otel.parquet_writer import SpanParquetWriter

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
    return 1 if summary.lines_bad or summary.rejected else 0


def feedback(args: argparse.Namespace) -> int:
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


def recipe(path: str | None):  # -> Recipe | None
    if path is None:
        return None
    from agl_bridge.trainer.rewards.recipes import load_recipe

    return load_recipe(path)


def weights(pairs: list[str] | None, what: str) -> dict[str, float] | None:
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


def recover(args: argparse.Namespace) -> int:
    from agl_bridge.otel.recovery import recover as recover_logs

    if not os.path.isdir(args.directory):
        raise FileNotFoundError(f"no such directory: {args.directory}")
    report = recover_logs(args.directory)
    print(f"recovered {report.rows} row(s) from write-ahead logs of dead writers in "
          f"{args.directory}")
    for path, reason in report.problems:  # kept on disk, never deleted: a person must look
        print(f"agl-bridge recover: kept {path}: {reason}", file=sys.stderr)
    return 1 if report.problems else 0


def report(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.training.report import report

    html_path, summary, problems = report(args.run, args.out, args.adapters or ())
    for problem in problems:
        print(f"agl-bridge report: skipped {problem}", file=sys.stderr)
    print(f"{summary['micro_batches']} micro-batches, {summary['steps']} optimizer steps, "
          f"{len(summary['adapters'])} adapter(s); {summary['malformed']} malformed line(s) "
          f"skipped")
    print(f"wrote {html_path} (and the panels as PNG beside it)")
    return 0


def judge(args: argparse.Namespace) -> int:
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
