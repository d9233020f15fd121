"""``agl-bridge``: the pipeline's stages from the shell.

    agl-bridge convert SPANS_DIR OUT.parquet        spans -> transitions, with a summary
    agl-bridge train OUT.parquet --base-model DIR   one GRPO round -> a new adapter version
    agl-bridge publish ADAPTER_DIR --base-url URL   load it into a running vLLM and probe it

Training imports torch only when ``train`` runs, so the capture install can use ``convert``.
"""

from __future__ import annotations

import argparse
import sys


def _convert(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.transitions import convert

    missing = args.missing_reward if args.missing_reward == "drop" else float(args.missing_reward)
    stats = convert(args.spans, args.out, missing_reward=missing)
    print(stats.summary())
    print(f"wrote {args.out}")
    return 0 if stats.transitions else 1


def _train(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.train import GRPOConfig, train_grpo

    cfg = GRPOConfig(learning_rate=args.learning_rate, num_train_epochs=args.num_train_epochs,
                     per_device_train_batch_size=args.per_device_train_batch_size,
                     epsilon=args.epsilon, lora_r=args.lora_r, seed=args.seed)
    result = train_grpo(args.transitions, args.base_model, args.adapters_root,
                        adapter_name=args.adapter_name, config=cfg, init_adapter=args.init_adapter)
    last = result.metrics[-1]
    print(f"{result.steps} steps, last loss {last['loss']:+.4f}; adapter: {result.adapter_dir}")
    return 0


def _publish(args: argparse.Namespace) -> int:
    from agl_bridge.trainer.publish import publish_adapter

    name = publish_adapter(args.base_url, args.adapter_dir, name=args.name)
    print(f"published {args.adapter_dir} as {name}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="agl-bridge", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="span Parquet -> transitions Parquet")
    c.add_argument("spans", help="a span Parquet file or a directory of them")
    c.add_argument("out", help="transitions Parquet file to write")
    c.add_argument("--missing-reward", default="drop",
                   help="'drop' episodes without a reward (default) or a number to give them")
    c.set_defaults(func=_convert)

    t = sub.add_parser("train", help="one GRPO round on a LoRA adapter")
    t.add_argument("transitions")
    t.add_argument("--base-model", required=True, help="a local Hugging Face model directory")
    t.add_argument("--adapters-root", default="adapters")
    t.add_argument("--adapter-name", default="policy")
    t.add_argument("--init-adapter", help="continue from this adapter version directory")
    t.add_argument("--learning-rate", type=float, default=1e-4)
    t.add_argument("--num-train-epochs", type=int, default=1)
    t.add_argument("--per-device-train-batch-size", type=int, default=8)
    t.add_argument("--epsilon", type=float, default=0.2)
    t.add_argument("--lora-r", type=int, default=8)
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=_train)

    p = sub.add_parser("publish", help="load an adapter version into a running vLLM")
    p.add_argument("adapter_dir")
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--name", help="served name (default: <adapter name>@v<N>)")
    p.set_defaults(func=_publish)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"agl-bridge {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
