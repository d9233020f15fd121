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
from typing import Any, TypeVar

from agl_bridge.settings import file_layer

T = TypeVar("T")


def resolved(cls: type[T], args: argparse.Namespace,
             layer: tuple[str, dict[str, Any]] | None = None) -> tuple[T, dict[str, str]]:
    """A configuration from defaults < the file (``--config``, or ``layer``: its label and
    values) < the flags, and where each value came from."""
    from agl_bridge import settings

    label, values = layer or file_layer(args)
    layers = [(label, values), ("flag", settings.given_flags(args, cls))]
    return settings.resolve(cls, layers=layers, source=f"{label} and flags"
                            if values else "flags")


def show(*parts: tuple[Any, dict[str, str]]) -> int:
    from agl_bridge.settings import describe

    print("\n\n".join(describe(config, origin) for config, origin in parts))
    return 0


def loop(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.loop.config import LoopConfig

    cfg, origin = resolved(LoopConfig, args)
    if args.print_config:
        return show((cfg, origin))
    from agl_bridge.trainer.loop.engine import Loop
    from agl_bridge.trainer.loop.state import STATE_FILE
    from agl_bridge.trainer.loop.summary import write_summary
    from agl_bridge.trainer.loop.tracking import TrackingCallback

    tracking = TrackingCallback(cfg)  # [train] report_to: MLflow, TensorBoard
    callbacks: list[Any] = [tracking]
    metrics_server = None
    if args.metrics_port:  # Prometheus: docs/metrics.md
        from agl_bridge.otel.metrics import serve
        from agl_bridge.trainer.loop.metrics import MetricsCallback

        callbacks.append(MetricsCallback())
        metrics_server = serve(callbacks[-1].registry, args.metrics_host, args.metrics_port)
        print(f"agl-bridge loop: metrics at http://{args.metrics_host}:{args.metrics_port}"
              f"/metrics", flush=True)
    try:
        data = Loop(cfg, fresh=args.fresh, callbacks=callbacks).run()
        print(write_summary(cfg.work, data))
    except BaseException as exc:
        tracking.finish(status="KILLED" if isinstance(exc, (KeyboardInterrupt, SystemExit))
                        else "FAILED")
        raise
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
    tracking.finish(cfg.work / "summary.txt", cfg.work / STATE_FILE)
    return 0


# ``agl-bridge replay`` is the loop's replay as a batch command: the loop's settings, and its
# own value for the number of replays (the loop's default, 0, is off)
REPLAY_SETTINGS = ("team", "temperature", "replay_k", "replay_field")
REPLAY_OVERRIDES = {"replay_k": 4}


def replay(args: argparse.Namespace) -> int:
    from agl_bridge.settings import SettingError, given_flags
    from agl_bridge.trainer.loop.config import LoopConfig
    from agl_bridge.trainer.loop.replay import replay

    cfg = LoopConfig(**{**REPLAY_OVERRIDES, **given_flags(args, LoopConfig)})
    if cfg.team is None or cfg.replay_k < 1:
        raise SettingError("replay needs --team (the team command) and --replay-k of 1 or more")
    inputs, run = replay(args.spans, cfg.team, Path(args.out), base_url=args.base_url,
                         aliases=Path(args.aliases) if args.aliases else None, k=cfg.replay_k,
                         temperature=cfg.temperature, field_name=cfg.replay_field,
                         limit=args.max_inputs)
    for episode in inputs.without_input[:20]:
        print(f"episode {episode}: no captured request messages"
              + (f" and no {cfg.replay_field!r}" if cfg.replay_field else "") + " (not replayed)",
              file=sys.stderr)
    print(f"{len(inputs.tasks)} of {inputs.episodes} stored episode(s) replayed x "
          f"{cfg.replay_k}" + (f" -> {run.spans}" if run else ""))
    return 0 if run else 1


def demo(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.loop.demo_config import demo_settings

    label, values = file_layer(args)
    demo_cfg, cfg, origin = demo_settings(args, values, label)
    if args.print_config:
        return show((demo_cfg, origin["demo"]), (cfg, origin["loop"]))
    from agl_bridge.trainer.loop import demo

    demo.run(demo_cfg, cfg, fresh=args.fresh)
    return 0


def convert(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.conversion.config import ConvertConfig

    config, origin = resolved(ConvertConfig, args)
    if args.print_config:
        return show((config, origin))
    from agl_bridge.trainer.conversion import convert

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
    print(stats.summary(config.algorithm))
    from agl_bridge.settings import record

    used = record(Path(args.out).with_suffix(".settings.json"), convert=config)
    print(f"wrote {args.out}" + (f" ({args.workers} parts: a transitions directory)"
                                 if args.workers > 1 else "") + f"; its settings: {used}")
    return 0 if stats.transitions else 1


def train(args: argparse.Namespace) -> int:
    import dataclasses

    from agl_bridge.settings import SettingError
    from agl_bridge.trainer.conversion.config import ConvertConfig
    from agl_bridge.trainer.training.config import GRPOConfig

    label, values = file_layer(args)
    names = {c: {f.name for f in dataclasses.fields(c)} for c in (ConvertConfig, GRPOConfig)}
    unknown = sorted(set(values) - names[ConvertConfig] - names[GRPOConfig])
    if unknown:
        raise SettingError(f"{args.config}: unknown setting(s) {unknown}; conversion: "
                           f"{sorted(names[ConvertConfig])}; training: "
                           f"{sorted(names[GRPOConfig])}")
    parts = [resolved(c, args, (label, {k: v for k, v in values.items() if k in names[c]}))
             for c in (ConvertConfig, GRPOConfig)]
    if args.print_config:
        return show(*parts)
    from agl_bridge.settings import values as plain
    from agl_bridge.trainer.training.from_traces import train_from_traces

    init = {args.adapter_name: args.init_adapter} if args.init_adapter else {}
    if args.continue_adapters:  # every adapter from its latest version in --adapters-dir
        from agl_bridge.trainer.adapters import latest_adapter

        root = Path(args.adapters_dir or Path(args.output_dir) / "adapters")
        for d in sorted(root.iterdir()) if root.is_dir() else []:
            latest = latest_adapter(root, d.name)
            if latest is not None:
                init.setdefault(d.name, str(latest))
    run = train_from_traces(args.traces, args.base_model, output_dir=args.output_dir,
                            adapter_name=args.adapter_name, init_adapters=init or None,
                            resume_from_checkpoint=args.resume or None,
                            adapters_dir=args.adapters_dir, **plain(parts[0][0]),
                            **plain(parts[1][0]))
    if run.conversion is not None:
        print(run.conversion.summary(plain(parts[0][0])["algorithm"]))
    for name, path in run.adapters.items():
        print(f"adapter {name}: {path}")
    print(f"{run.steps} optimizer steps; metrics: {run.metrics_path}")
    return 0


def export(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.conversion.export_config import ExportConfig

    config, origin = resolved(ExportConfig, args)
    if args.print_config:
        return show((config, origin))
    from agl_bridge.settings import record
    from agl_bridge.trainer.conversion.export import export as write

    summary = write(args.transitions, args.out, config)
    print(summary.summary())
    used = record(Path(args.out) / "export.settings.json", export=config)
    print(f"wrote {', '.join(summary.files)} ({config.format}); its settings: {used}")
    return 0


def registry_settings(args: argparse.Namespace) -> dict:
    """Registry, servers, base model and rank limit: flags, else what ``agl-bridge serve``
    recorded in the registry."""
    import json

    from agl_bridge.settings import given_flags
    from agl_bridge.trainer.serving.config import ServeConfig

    serve = ServeConfig(**given_flags(args, ServeConfig))
    registry = serve.registry_dir
    recorded = {}
    config = Path(registry) / "servers.json"
    if config.exists():
        recorded = json.loads(config.read_text())
    servers = args.server or recorded.get("servers")
    if not servers:
        raise ValueError(f"no servers: pass --server URL or start them with agl-bridge serve "
                         f"--registry {registry}")
    given = getattr(args, "max_lora_rank", None)  # absent unless given
    return {"registry": registry, "servers": servers,
            "base_model": args.base_model or recorded.get("base_model"),
            "max_lora_rank": given or recorded.get("max_lora_rank") or serve.max_lora_rank}


def publish(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.serving.publisher import Publisher, publish_adapter

    if args.alias is None:
        if not args.server:
            raise ValueError("pass --alias (with --registry) or --server URL")
        for server in args.server:
            name = publish_adapter(server, args.adapter_dir)
        print(f"published {args.adapter_dir} as {name}")
        return 0
    publisher = Publisher(**registry_settings(args))
    for reloaded in publisher.reconcile():  # a restarted server gets its live versions first
        print(f"loaded again: {reloaded}")
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

    publisher = Publisher(**registry_settings(args))
    for reloaded in publisher.reconcile():
        print(f"loaded again: {reloaded}")
    name = publisher.rollback(args.alias, args.version)
    print(f"alias {args.alias} -> {name}")
    return 0


def aliases_serve(args: argparse.Namespace) -> int:
    from agl_bridge.settings import given_flags
    from agl_bridge.trainer.serving.alias_server import AliasServer
    from agl_bridge.trainer.serving.config import ServeConfig
    from agl_bridge.trainer.serving.registry import ALIASES_FILE

    registry = ServeConfig(**given_flags(args, ServeConfig)).registry_dir
    server = AliasServer(registry, args.host, args.port)
    print(f"alias table {Path(registry).resolve() / ALIASES_FILE} at {server.url}: "
          f"agents set AGL_BRIDGE_ALIASES={server.url} (and AGL_BRIDGE_PROMPTS="
          f"{server.prompts_url} for the prompt table); Ctrl-C stops", flush=True)
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

    from agl_bridge.trainer.serving.config import ServeConfig
    from agl_bridge.trainer.serving.registry import ALIASES_FILE

    cfg, origin = resolved(ServeConfig, args)
    if args.print_config:
        return show((cfg, origin))
    from agl_bridge.trainer.serving.vllm_server import VLLMServer, cpu_share

    registry = Path(cfg.registry_dir)
    servers = []
    try:
        for i in range(args.replicas):
            server = VLLMServer(args.model, served_model_name=args.served_model_name,
                                port=(args.port + i) if args.port else None,
                                log_path=registry / f"vllm-{i}.log", **cfg.server_options(),
                                cpu_cores=cpu_share(i, args.replicas) if args.replicas > 1
                                else None)
            registry.mkdir(parents=True, exist_ok=True)
            servers.append(server.start())
            print(f"replica {i}: {server.base_url} (model {args.served_model_name})", flush=True)
        (registry / "servers.json").write_text(json.dumps({
            "servers": [s.base_url for s in servers], "base_model": str(Path(args.model).resolve()),
            "max_lora_rank": cfg.max_lora_rank}, indent=2))
        from agl_bridge.trainer.serving.publisher import Publisher

        publisher = Publisher([s.base_url for s in servers], registry, base_model=args.model,
                              max_lora_rank=cfg.max_lora_rank)
        for reloaded in publisher.reconcile():  # a restart: the registry's live versions
            print(f"loaded again: {reloaded}", flush=True)
        print(f"registry {registry}: agents set AGL_BRIDGE_ALIASES="
              f"{registry.resolve() / ALIASES_FILE}; Ctrl-C stops", flush=True)
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
        metrics_server = None
        if args.metrics_port:  # Prometheus: docs/metrics.md
            from agl_bridge.otel.metrics import collect_registry, serve

            try:
                metrics_server = serve(collect_registry(receiver, writer), args.host,
                                       args.metrics_port)
            except BaseException:
                receiver.stop()
                raise
            print(f"  metrics    http://{args.host}:{args.metrics_port}/metrics")
        if token:
            print("  requests need 'Authorization: Bearer <token>'")
        elif args.host not in ("127.0.0.1", "localhost", "::1"):
            print(f"agl-bridge collect: warning: listening on {args.host} without a token: anyone "
                  f"who reaches it can write spans (set --token or {TOKEN_ENV})", file=sys.stderr)
        print("Ctrl-C or SIGTERM stops and turns the logs into Parquet files.", flush=True)
        while not stop.wait(1.0):
            pass
        receiver.stop()
        if metrics_server is not None:
            metrics_server.shutdown()
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


def apo(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.loop.apo.config import ApoConfig

    config, origin = resolved(ApoConfig, args)
    if args.print_config:
        return show((config, origin))
    from agl_bridge.settings import record
    from agl_bridge.trainer.loop.apo.run import run_apo

    outcomes = run_apo(args.traces, config, args.workdir)
    record(Path(args.workdir) / "apo.settings.json", apo=config)
    for o in outcomes:
        what = f"published {o.published}" if o.published else "nothing published"
        print(f"{o.agent}: {o.candidates} candidates from {o.root}, best {o.best}: {what}")
    return 0


def prompts(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.serving.prompts import PromptRegistry

    reg = PromptRegistry(args.registry)
    need = {"publish": 1, "rollback": 1, "diff": 2, "history": 0}[args.action]
    if (args.agent is None and args.action != "history") or len(args.values) != need:
        raise ValueError(f"prompts {args.action} takes "
                         + {"publish": "AGENT FILE", "rollback": "AGENT VERSION",
                            "diff": "AGENT OLD NEW", "history": "[AGENT]"}[args.action])
    if args.action == "publish":
        v = reg.publish(args.agent, Path(args.values[0]).read_text(),
                        note=args.note or f"from {args.values[0]}")
        print(f"{args.agent} -> {v.name} ({reg.table_path})")
    elif args.action == "rollback":
        print(f"{args.agent} -> {reg.rollback(args.agent, args.values[0]).name}")
    elif args.action == "diff":
        print(reg.diff(args.agent, *args.values), end="")
    else:
        for agent, versions in sorted(reg.read_history().items()):
            if args.agent in (None, agent):
                for v in versions:
                    print(f"{v.name}\t{v.state}\t{v.file or '-'}\t{v.note or ''}")
    return 0


def judge(args: argparse.Namespace) -> int:
    from agl_bridge.settings import SettingError
    from agl_bridge.trainer.judging.config import JudgeConfig

    config, origin = resolved(JudgeConfig, args)
    if args.print_config:
        return show((config, origin))
    missing = [f"--{n.replace('_', '-')}" for n in ("rubric", "base_url", "model")
               if getattr(config, n) is None]
    if missing:
        raise SettingError(f"the judge needs {', '.join(missing)} (flags or --config)")
    from agl_bridge.settings import record
    from agl_bridge.trainer.judging import judge_spans
    from agl_bridge.trainer.judging.cache import CACHE_DIR

    summary = judge_spans(args.spans, config, progress=not args.quiet)
    record(Path(args.spans) / CACHE_DIR / "settings.json", judge=config)
    for problem in summary.problems[:50]:
        print(f"agl-bridge judge: {problem}", file=sys.stderr)
    if len(summary.problems) > 50:
        print(f"agl-bridge judge: ... and {len(summary.problems) - 50} more problem(s)",
              file=sys.stderr)
    print(summary.summary())
    return 1 if summary.failed or summary.problems else 0
