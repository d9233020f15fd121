"""Loaded at start-up by every Python process of a vLLM server that ``VLLMServer`` starts (this
folder is on its PYTHONPATH): patches vLLM's CPU LoRA ops once vLLM's punica wrapper is
imported. Any ``sitecustomize`` that was already on the path is run first."""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:  # chain to the environment's own sitecustomize, if it has one
    if _entry and os.path.abspath(_entry) != _here:
        _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [_entry])
        if _spec is not None and _spec.loader is not None:
            _mod = importlib.util.module_from_spec(_spec)
            _spec.loader.exec_module(_mod)
            break

try:
    import wrapt

    def _patch(_module):
        from agl_bridge.trainer.serving.vllm_cpu_lora import install

        install()

    wrapt.register_post_import_hook(_patch, "vllm.lora.punica_wrapper.punica_cpu")
except Exception as exc:  # never stop the server from starting
    print(f"agl-bridge: vLLM CPU LoRA patch not installed: {exc!r}", file=sys.stderr)
