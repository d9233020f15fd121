"""The grouped CPU LoRA ops give vLLM's own torch ops' results (where those are right)."""

import pytest
import torch
from vllm.lora.ops.torch_ops import lora_ops as upstream

from agl_bridge.trainer.serving import vllm_cpu_lora as ours


def setup(seed=0, tokens=37, slots=4, hidden=24, rank=8, out=40):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(slots, 1, rank, hidden, generator=g)
    b = torch.randn(slots, 1, out, rank, generator=g)
    a[-1] = 0  # upstream applies the last slot to rows marked -1 ("no adapter"): keep it empty
    b[-1] = 0
    idx = torch.randint(-1, slots - 1, (tokens,), generator=g)
    return g, a, b, idx


@pytest.mark.parametrize("uniform", [False, True])
def test_shrink_expand_and_slice_match_upstream(uniform):
    g, a, b, idx = setup()
    if uniform:
        idx[:] = 1
    x = torch.randn(idx.numel(), a.shape[-1], generator=g)
    y_up, y_ours = torch.full((idx.numel(), 8), 7.0), torch.full((idx.numel(), 8), 7.0)
    upstream.bgmv_shrink(x, a, y_up, idx, 0.5)
    ours.bgmv_shrink(x, a, y_ours, idx, 0.5)
    torch.testing.assert_close(y_ours, y_up)
    for add in (True, False):
        base = torch.randn(idx.numel(), 40, generator=g)
        up, mine = base.clone(), base.clone()
        upstream.bgmv_expand(y_up, b, up, idx, add)
        ours.bgmv_expand(y_up, b, mine, idx, add)
        torch.testing.assert_close(mine, up)
        wide_up, wide_ours = torch.randn(idx.numel(), 100, generator=g), None
        wide_ours = wide_up.clone()
        upstream.bgmv_expand_slice(y_up, b, wide_up, idx, 30, 40, add)
        ours.bgmv_expand_slice(y_up, b, wide_ours, idx, 30, 40, add)
        torch.testing.assert_close(wide_ours, wide_up)


def test_sgmv_explodes_per_sequence_indices_and_rows_without_adapter_get_nothing():
    g, a, b, _ = setup()
    seq_lens, seq_idx = torch.tensor([5, 3, 4]), torch.tensor([2, -1, 0])
    x = torch.randn(12, a.shape[-1], generator=g)
    y_up, y_ours = torch.zeros(12, 8), torch.zeros(12, 8)
    args = (torch.tensor([0, 5, 8]), seq_lens, seq_idx, 3, 5, 12)
    upstream.sgmv_shrink(x, a, y_up, *args, 1.0)
    ours.sgmv_shrink(x, a, y_ours, *args, 1.0)
    torch.testing.assert_close(y_ours, y_up)
    assert torch.count_nonzero(y_ours[5:8]) == 0  # the sequence without an adapter
    b[-1] = 1.0  # now upstream would add slot -1's weights to it; ours adds nothing
    out = torch.zeros(12, 40)
    ours.sgmv_expand(y_ours, b, out, *args, True)
    assert torch.count_nonzero(out[5:8]) == 0 and torch.count_nonzero(out[:5]) > 0


def test_install_replaces_the_names_punica_cpu_calls(monkeypatch):
    import vllm.lora.ops.torch_ops as pkg
    from vllm.lora.punica_wrapper import punica_cpu

    for mod in (upstream, pkg, punica_cpu):
        for name in ours._NAMES:
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, getattr(mod, name))  # restored after the test
    monkeypatch.setenv(ours.ENV, "0")
    assert ours.install() is False and punica_cpu.sgmv_shrink is upstream.sgmv_shrink
    monkeypatch.delenv(ours.ENV)
    assert ours.install() is True
    assert punica_cpu.sgmv_shrink is ours.sgmv_shrink
    assert punica_cpu.bgmv_expand_slice is ours.bgmv_expand_slice
    assert upstream.bgmv_shrink is ours.bgmv_shrink
