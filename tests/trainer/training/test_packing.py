"""Shared-prompt packing: a GRPO group's prompt runs once, in one row with a mask that keeps the
completions apart, and every completion token gets the log-probability and gradient it gets in
its own row."""

import random

import pyarrow as pa
import pytest
import torch

from agl_bridge.trainer.training import GRPOConfig, train_policy
from agl_bridge.trainer.training.data import batches, collate, pack_rows, row_cost
from agl_bridge.trainer.training.model import (
    completion_logprobs,
    load_policy,
    packing_support,
    peft_name,
    trainable,
)
from tests.factories import transitions


def _rows(groups: list[tuple[list[int], list[list[int]]]]) -> list[dict]:
    out = []
    for prompt, completions in groups:
        for c in completions:
            out.append({"prompt_ids": list(prompt), "completion_ids": list(c),
                        "completion_mask": [1] * len(c), "behaviour_logprobs": None})
    return out


def _group_rows(seed: int) -> list[dict]:
    """Two groups with long prompts, completions of different lengths, and one lone sequence."""
    g = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 250, (n,), generator=g).tolist()

    return _rows([(ids(30), [ids(5), ids(3), ids(6)]), (ids(24), [ids(4), ids(4)]),
                  (ids(27), [ids(2)])])


@pytest.fixture(scope="module")
def policy(tiny):
    model, device = load_policy(tiny, GRPOConfig(lora_r=4, lora_alpha=8), ["a"], {})
    model.set_adapter(peft_name("a"))
    torch.manual_seed(0)
    with torch.no_grad():  # LoRA B starts at zero; make the adapter matter
        for p in trainable(model):
            p.normal_(0, 0.05)
    return model, device


def _logprobs_and_grads(model, batch):
    for p in trainable(model):
        p.grad = None
    logp = completion_logprobs(model, batch)
    mask = batch["loss_mask"]
    weights = torch.linspace(-1, 1, logp.numel()).view_as(logp)  # any loss that uses every token
    (logp * weights * mask).sum().backward()
    return logp.detach() * mask, [p.grad.clone() for p in trainable(model)]


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_rows_give_each_completion_the_logprobs_and_gradients_of_its_own_row(policy, seed):
    model, device = policy
    rows = _group_rows(seed)
    packing = [[0, 1, 2], [3, 4], [5]]
    plain = collate(rows, 0, device)
    packed = collate(rows, 0, device, packing, model.dtype)
    assert packed["input_ids"].shape == (3, 30 + 5 + 3 + 6)  # 3 rows instead of 6
    assert torch.equal(plain["targets"], packed["targets"])
    lp_plain, g_plain = _logprobs_and_grads(model, plain)
    lp_packed, g_packed = _logprobs_and_grads(model, packed)
    assert torch.allclose(lp_plain, lp_packed, atol=1e-5), (lp_plain - lp_packed).abs().max()
    for a, b in zip(g_plain, g_packed):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()
    assert any(g.abs().sum() > 0 for g in g_packed)


def test_packing_with_the_members_out_of_order_and_a_row_of_one(policy):
    model, device = policy
    rows = _group_rows(3)
    order = [4, 0, 5, 2, 3, 1]
    shuffled = [rows[i] for i in order]
    packing = pack_rows([r["prompt_ids"] for r in shuffled],
                        [len(r["completion_ids"]) for r in shuffled], hidden_size=64)
    assert packing is not None
    assert sorted(sorted(r) for r in packing) == [[0, 4], [1, 3, 5], [2]]
    lp_plain, _ = _logprobs_and_grads(model, collate(shuffled, 0, device))
    lp_packed, _ = _logprobs_and_grads(model, collate(shuffled, 0, device, packing, model.dtype))
    assert torch.allclose(lp_plain, lp_packed, atol=1e-5)


def test_a_wrong_packing_is_refused(policy):
    _, device = policy
    rows = _group_rows(0)
    with pytest.raises(ValueError, match="each of the 6 sequences once"):
        collate(rows, 0, device, [[0, 1, 2], [3, 4]])
    with pytest.raises(ValueError, match="different prompts"):
        collate(rows, 0, device, [[0, 1, 3], [2, 4], [5]])


def test_the_mask_keeps_completions_apart_and_padding_sees_itself(policy):
    _, device = policy
    rows = _rows([([7, 8], [[1, 2], [3]]), ([9], [[4]])])
    batch = collate(rows, 0, device, [[0, 1], [2]], torch.float32)
    allowed = batch["attention_mask"][:, 0] == 0
    # row 0: prompt 7 8 | completion 1 2 | completion 3
    assert allowed[0].int().tolist() == [[1, 0, 0, 0, 0],
                                         [1, 1, 0, 0, 0],
                                         [1, 1, 1, 0, 0],
                                         [1, 1, 1, 1, 0],
                                         [1, 1, 0, 0, 1]]
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 2]
    # row 1: prompt 9 | completion 4 | padding that attends to itself only
    assert allowed[1].int().tolist()[2:] == [[0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]
    # targets are predicted by: the prompt's last position, then each completion's own
    assert batch["index"].tolist() == [[1, 2], [1, 0], [5 + 0, 0]]


def test_pack_rows_packs_only_when_it_costs_less():
    # no shared prompt: nothing to pack
    assert pack_rows([[1, 2], [3, 4]], [5, 5], 64) is None
    # a long shared prompt with short completions: one row
    assert pack_rows([[1] * 40] * 4, [16] * 4, 576) == [[0, 1, 2, 3]]
    # a short prompt and long completions with a small hidden size: the packed row's attention
    # costs more than the prompt it saves
    assert pack_rows([[1] * 4] * 4, [400] * 4, 16) is None
    assert row_cost(1604, 16) * 1 > 4 * row_cost(404, 16)
    # a sliding window shorter than the packed row: no packing
    assert pack_rows([[1] * 40] * 4, [16] * 4, 576, max_row=64) is None
    # one group and many singles: the padded width counts for both layouts
    prompts = [[1] * 10] * 2 + [[i] * 10 for i in range(2, 8)]
    assert pack_rows(prompts, [30] * 8, 576) is None


def test_batches_keep_sequences_with_the_same_key_together():
    keys = [i // 4 for i in range(32)]
    got = batches(list(range(32)), 8, random.Random(0), None, keys)
    assert sorted(i for b in got for i in b) == list(range(32))
    for b in got:
        assert len({keys[i] for i in b}) == 2 and len(b) == 8
    assert [keys[i] for b in got for i in b] != sorted(keys)  # the groups are shuffled
    # without keys the members scatter (the old behaviour)
    scattered = batches(list(range(32)), 8, random.Random(0), None)
    assert any(len({keys[i] for i in b}) > 2 for b in scattered)


def test_training_packs_and_matches_unpacked_training(tiny, tmp_path, monkeypatch):
    """The same micro-batches trained packed and unpacked end at the same adapter."""
    from safetensors.torch import load_file

    from agl_bridge.trainer.training import loop

    seen = []

    def spy(rows, pad_id, device, packing=None, mask_dtype=torch.float32):
        seen.append(packing)
        return collate(rows, pad_id, device, packing, mask_dtype)

    monkeypatch.setattr(loop, "collate", spy)

    table = transitions([1.0, 0.0, 0.5, 0.25], groups=["g", "g", "g", "g"])
    prompt = pa.array([[257] + list(range(40, 60)) + [258]] * 4, pa.list_(pa.int32()))
    table = table.set_column(table.schema.get_field_index("prompt_ids"),
                             table.schema.field("prompt_ids"), prompt.cast(
                                 table.schema.field("prompt_ids").type))
    results = {}
    for share in (True, False):
        cfg = GRPOConfig(learning_rate=1e-2, per_device_train_batch_size=4, share_prompts=share)
        out = train_policy(table, tiny, tmp_path / str(share), config=cfg, progress=False)
        assert out.steps == 1
        results[share] = load_file(str(out.adapter_dir / "adapter_model.safetensors"))
    assert seen == [[[0, 1, 2, 3]], None]  # packed, then not
    assert results[True].keys() == results[False].keys()
    for k in results[True]:
        assert torch.allclose(results[True][k], results[False][k], atol=1e-5), k


def test_packing_support_reads_the_model(policy):
    model, _ = policy
    ok, hidden, window = packing_support(model)
    assert ok and hidden == model.config.hidden_size and window is None
