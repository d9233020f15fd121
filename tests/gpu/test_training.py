"""``train_from_traces`` with every policy kind on the GPU: spans in, adapters out, trained on
CUDA (the peak of CUDA memory moved, and the metrics' ``memory_mb`` is CUDA's, not the process's
RSS), LoRA weights kept in float32 beside the bfloat16 base, and each adapter passes the
publisher's validation."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from safetensors.torch import load_file

import agl_bridge
from tests.factories import llm, reward, table

pytestmark = pytest.mark.gpu


@pytest.fixture
def spans_dir(tmp_path):
    rows = []
    for e, r in enumerate([1.0, 0.0, 1.0, 0.0, 0.5, 0.2]):
        for agent in ("solver", "checker"):
            rows.append(llm(f"e{e}", e * 10, agent=agent, prompt=[257, 40 + e, 258],
                            completion=[60 + e, 61, 258]))
        rows.append(reward(f"e{e}", e * 10 + 5, r))
    (tmp_path / "spans").mkdir()
    pq.write_table(table(rows), tmp_path / "spans" / "part.parquet")
    return tmp_path / "spans"


@pytest.mark.parametrize("policy", ["shared", "per_agent_lora", "per_agent_model"])
def test_train_from_traces_on_the_gpu(cuda, tiny, spans_dir, tmp_path, policy):
    import torch

    from agl_bridge.trainer.serving.validation import validate_adapter

    torch.cuda.reset_peak_memory_stats(cuda)
    run = agl_bridge.train_from_traces(
        spans_dir, tiny, algorithm="at_grpo", policy=policy, output_dir=tmp_path / "run",
        learning_rate=5e-2, per_device_train_batch_size=2, progress=False)
    peak_mb = torch.cuda.max_memory_allocated(cuda) / 2**20
    assert peak_mb > 0  # it ran on the GPU
    names = {"shared": {"policy"}}.get(policy, {"solver", "checker"})
    assert set(run.adapters) == names and run.steps > 0
    metrics = [json.loads(line) for line in run.metrics_path.read_text().splitlines()]
    assert metrics and all(0 < m["memory_mb"] <= peak_mb + 1 for m in metrics), (peak_mb, metrics)
    assert all(m["loss"] == m["loss"] for m in metrics)  # finite, not NaN
    for name, adapter in run.adapters.items():
        weights = load_file(str(adapter / "adapter_model.safetensors"))
        assert weights and all(v.dtype == torch.float32 for v in weights.values()), name
        assert all(torch.isfinite(v).all() for v in weights.values())
        assert any(v.abs().sum() > 0 for k, v in weights.items() if "lora_B" in k), name
        validate_adapter(adapter, base_model=tiny)
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    assert saved["settings"]["train"]["policy"] == policy
