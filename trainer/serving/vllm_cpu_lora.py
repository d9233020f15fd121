"""Faster multi-LoRA ops for vLLM's CPU backend, patched into the server process we start.

vLLM's PyTorch-native punica ops (``vllm.lora.ops.torch_ops``, used by ``PunicaWrapperCPU``)
gather a full copy of the LoRA matrix for every token (``weights[indices]``, shape
tokens x rank x hidden) and contract it with an einsum. A prefill of a few thousand tokens thus
copies gigabytes per layer: on 2 cores, SmolLM2-135M served 3-4x fewer tokens/s with an adapter
than without. The same result comes from one matrix product per adapter present in the batch:
``out[rows of adapter k] = x[rows] @ W[k].T``. Index -1 means "no adapter" (vLLM's contract,
see ``punica_wrapper/utils.py``); those rows get no LoRA term here, where the upstream CPU ops
would apply the last slot's weights to them.

``install()`` replaces the six functions in ``vllm.lora.ops.torch_ops`` and the names
``punica_cpu`` imported from it. ``VLLMServer`` puts ``vllm_site/`` on the server's
``PYTHONPATH``, whose ``sitecustomize`` registers ``install`` as a post-import hook, so the
engine's worker processes are patched too. ``AGL_BRIDGE_VLLM_CPU_LORA=0`` turns it off.
"""

from __future__ import annotations

import os

import torch

ENV = "AGL_BRIDGE_VLLM_CPU_LORA"
_NAMES = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand",
          "sgmv_expand_slice")


def _groups(indices: torch.Tensor):
    """(adapter slot, row positions) for each slot present; rows with -1 are left out."""
    if indices.numel() == 0:
        return
    first = int(indices[0])
    if bool((indices == first).all()):  # the common case: one adapter for the whole batch
        if first >= 0:
            yield first, slice(None)
        return
    for slot in torch.unique(indices).tolist():
        if slot >= 0:
            yield slot, (indices == slot).nonzero(as_tuple=True)[0]


def _weights(w: torch.Tensor, slot: int, dtype: torch.dtype) -> torch.Tensor:
    w = w[slot]
    if w.dim() == 3:  # (1, out, in) in the stacked layout
        w = w.squeeze(0)
    return w.to(dtype)


def bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling=1.0):
    x = inputs.to(output_tensor.dtype)
    rank = lora_a_weights.shape[-2]
    output_tensor[:, :rank] = 0
    for slot, rows in _groups(lora_indices_tensor):
        output_tensor[rows, :rank] = scaling * (x[rows] @ _weights(lora_a_weights, slot,
                                                                   x.dtype).T)


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True):
    x = inputs.to(output_tensor.dtype)
    common = min(lora_b_weights.shape[-2], output_tensor.shape[1])
    if not add_inputs:
        output_tensor[:, :common] = 0
    for slot, rows in _groups(lora_indices_tensor):
        out = x[rows] @ _weights(lora_b_weights, slot, x.dtype).T
        if x.shape[0] == 1 and output_tensor.shape[0] != 1:  # one row: added to every row,
            output_tensor[:, :common] += out[:, :common]     # as upstream broadcasts it
        else:
            output_tensor[rows, :common] += out[:, :common]


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset,
                      slice_size, add_inputs=True):
    x = inputs.to(output_tensor.dtype)
    cols = slice(slice_offset, slice_offset + slice_size)
    if not add_inputs:
        output_tensor[:, cols] = 0
    for slot, rows in _groups(lora_indices_tensor):
        output_tensor[rows, cols] += x[rows] @ _weights(lora_b_weights, slot, x.dtype).T


def _explode(lora_indices_tensor, seq_len_tensor):
    return torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)


def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                lora_indices_tensor, batches, max_seq_length, token_nums, scaling):
    bgmv_shrink(inputs, lora_a_weights, output_tensor,
                _explode(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                lora_indices_tensor, batches, max_seq_length, token_nums, add_inputs=False):
    bgmv_expand(inputs, lora_b_weights, output_tensor,
                _explode(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor,
                      lora_indices_tensor, batches, max_seq_length, token_nums, slice_offset,
                      slice_size, add_inputs=False):
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor,
                      _explode(lora_indices_tensor, seq_len_tensor), slice_offset, slice_size,
                      add_inputs)


def install(_module=None) -> bool:
    """Patch vLLM's torch LoRA ops (idempotent). Returns False when turned off."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    import importlib

    ours = globals()
    for modname in ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops",
                    "vllm.lora.punica_wrapper.punica_cpu"):
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            continue
        for name in _NAMES:
            if hasattr(mod, name):
                setattr(mod, name, ours[name])
    return True
