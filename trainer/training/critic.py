"""PPO's critic (``algorithm = "ppo"``): a value head per trained policy, on the policy's own
LoRA-adapted model, and the GAE targets it gives before an update.

Why a head on the policy rather than a separate critic adapter or model: the head reads the
hidden state the policy's forward pass already computed (``model.completion_hidden``), so the
value costs one [H] x 1 product per token, and nothing else: no second decoder pass per
micro-batch, no second set of activations kept for backward, no second base model in memory.
A separate critic adapter on the same base would double every step's decoder work (the two
adapters cannot share a pass), and a separate critic model would double the weights too; on a
machine of 2 CPU cores (and on one GPU beside vLLM) that is the cost that matters. The price
is a shared trunk: the value loss reaches the policy's LoRA weights (weighted by ``vf_coef``,
as in TRL's value-head PPO and OpenAI's original); the head's own gradients are clipped apart
from the LoRA's, as verl clips its critic apart from its actor.

One head per adapter (``per_agent_lora``: per agent; ``shared``: one), a ``Linear(H, 1)`` in
float32, its weight started at zero and its bias at the mean return of its first round
(``value_head_init``, ``mean_returns``; or at zero): every value the same until it learns, no
random baseline, and on the returns' scale from the start. The clipped value loss lets a
prediction move at most ``cliprange_value`` a round, so a head at 0 under returns of 1 or 2
would stay behind them for several rounds; TRL's PPO starts its value model from the reward
model for the same reason. It is saved beside the adapter it belongs to
(``value_head.safetensors`` in the version directory, which vLLM ignores) and read back when
training continues from that version (then its bias is left as it was learnt).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agl_bridge.trainer.training.gae import chain_gae, chains, masked_whiten
from agl_bridge.trainer.training.model import peft_name

VALUE_HEAD_FILE = "value_head.safetensors"
logger = logging.getLogger(__name__)


class ValueHeads(torch.nn.Module):
    """``Linear(hidden_size, 1)`` per adapter name; ``heads(name, hidden)`` [B, C, H] -> the
    values [B, C] (float32)."""

    def __init__(self, names: Sequence[str], hidden_size: int) -> None:
        super().__init__()
        self.heads = torch.nn.ModuleDict()
        for name in names:
            head = torch.nn.Linear(hidden_size, 1, dtype=torch.float32)
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
            self.heads[peft_name(name)] = head

    def forward(self, name: str, hidden: torch.Tensor) -> torch.Tensor:
        # a copy, not a view ([B, C]: small): under FSDP the heads are a unit, whose output
        # FSDP2 hooks for backward (an in-place op on a view of it would drop the hook)
        return self.heads[peft_name(name)](hidden.float()).squeeze(-1).clone()

    def save(self, name: str, directory: str | os.PathLike[str],
             state: dict[str, torch.Tensor] | None = None) -> Path:
        """The head of ``name`` into ``directory`` (an adapter version's). ``state``: the
        heads' whole weights, keyed as this module's ``state_dict``, where it holds FSDP
        shards (``sharding.full_state``)."""
        from safetensors.torch import save_file

        prefix = f"heads.{peft_name(name)}."
        weights = ({k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
                   if state is not None else self.heads[peft_name(name)].state_dict())
        out = Path(directory) / VALUE_HEAD_FILE
        save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, str(out))
        return out

    def load(self, name: str, directory: str | os.PathLike[str]) -> bool:
        """The head saved beside an adapter version, if there is one (a version trained
        without PPO has none: its head starts at zero). A head of another size is refused."""
        from safetensors.torch import load_file

        path = Path(directory) / VALUE_HEAD_FILE
        if not path.is_file():
            return False
        head = self.heads[peft_name(name)]
        saved = load_file(str(path))
        for key, value in head.state_dict().items():
            if key not in saved or saved[key].shape != value.shape:
                raise ValueError(f"{path}: a value head for another model ({key}: "
                                 f"{list(saved[key].shape) if key in saved else 'missing'}, "
                                 f"expected {list(value.shape)})")
        head.load_state_dict({k: saved[k] for k in head.state_dict()})
        return True


def load_value_heads(names: Sequence[str], hidden_size: int,
                     init_adapters: dict[str, str | os.PathLike[str]],
                     device: torch.device, start: Mapping[str, float] | None = None
                     ) -> ValueHeads:
    """One head per name, from the version it continues (``init_adapters``); a new one (no
    head saved there) at zero, its bias at ``start[name]`` where given (``mean_returns``)."""
    heads = ValueHeads(names, hidden_size)
    for name in names:
        if name in init_adapters and heads.load(name, init_adapters[name]):
            continue
        head = heads.heads[peft_name(name)]
        if start is not None and name in start and isinstance(head, torch.nn.Linear):
            torch.nn.init.constant_(head.bias, start[name])
            logger.info("agl_bridge: value head %s starts at the mean return %.4f", name,
                        start[name])
    return heads.to(device)


def _chains_of(rows: Sequence[dict[str, Any]], mine: Sequence[int]) -> list[list[int]]:
    """The chains (``gae.chains``) of rows ``mine``, as positions in ``mine``: one agent's
    turns in one episode (and a tree-sampled candidate's own)."""
    keys = [(rows[i]["episode_id"], rows[i]["agent_name"], rows[i].get("candidate_index"))
            for i in mine]
    return chains(keys, [rows[i]["turn_index"] for i in mine])


def mean_returns(rows: Sequence[dict[str, Any]], *, gamma: float) -> dict[str, float]:
    """Per adapter, the mean over its trained tokens of the return to the end of the token's
    chain: the rewards at or after it, discounted by ``gamma`` per generated token (GAE's
    return with ``lam`` 1 and no critic). A new value head's bias (``value_head_init =
    "mean_return"``): the constant that fits the round's returns best in squared error, so
    the critic starts on their scale and its clipped loss moves it from there. ``rows`` as
    ``gae_targets``'; an adapter without a trained token gets 0."""
    out: dict[str, float] = {}
    for name in sorted({r["adapter"] for r in rows}):
        mine = [i for i, r in enumerate(rows) if r["adapter"] == name]
        masks = [torch.tensor(rows[i]["completion_mask"], dtype=torch.bool) for i in mine]
        _, returns = chain_gae([torch.zeros(m.numel()) for m in masks], masks,
                               [rows[i]["reward"] for i in mine], _chains_of(rows, mine),
                               gamma=gamma, lam=1.0)
        keep = torch.cat(masks)
        out[name] = float(torch.cat(returns)[keep].double().mean()) if keep.any() else 0.0
    return out


def gae_targets(rows: Sequence[dict[str, Any]],
                values_of: Callable[[str, list[int]], list[torch.Tensor]],
                batch_size: int, *, gamma: float, lam: float) -> dict[int, torch.Tensor]:
    """Per transition, [3, C]: the critic's values before the update, the whitened GAE
    advantages, the returns (advantages before whitening + values).

    ``rows``: transitions with ``adapter``, ``episode_id``, ``agent_name``, ``turn_index``,
    ``candidate_index``, ``completion_mask``, ``reward``; ``values_of(adapter, indices)``: the
    critic's values [C_i] of those transitions' completion tokens (one no-grad pass, as verl's
    ``compute_values`` before its update), asked ``batch_size`` at a time. A chain is one
    agent's turns in one episode (and a tree-sampled candidate's own); advantages are whitened
    over each adapter's trained tokens, so each policy's step has the same scale whatever its
    rewards'."""
    out: dict[int, torch.Tensor] = {}
    for name in sorted({r["adapter"] for r in rows}):
        mine = [i for i, r in enumerate(rows) if r["adapter"] == name]
        values: list[torch.Tensor] = []
        for s in range(0, len(mine), batch_size):
            values += values_of(name, mine[s:s + batch_size])
        masks = [torch.tensor(rows[i]["completion_mask"], dtype=torch.bool,
                              device=values[0].device) for i in mine]
        advantages, returns = chain_gae(values, masks, [rows[i]["reward"] for i in mine],
                                        _chains_of(rows, mine), gamma=gamma, lam=lam)
        flat = masked_whiten(torch.cat(advantages), torch.cat(masks))
        at = 0
        for j, i in enumerate(mine):
            n = values[j].numel()
            out[i] = torch.stack([values[j].float(), flat[at:at + n].float(),
                                  returns[j].float()]).detach()
            at += n
    return out
