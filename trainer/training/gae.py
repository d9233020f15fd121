"""PPO's advantages: token-level GAE over an agent's turns in an episode, as pure functions.

The transitions table has one row per agent per turn. PPO sees an agent's turns in one episode
as one trajectory (a *chain*): its completion tokens, turn after turn. Each turn's reward sits
on the turn's last trained token (the conversion placed it there: ``algorithm = "ppo"``);
everything the agent did not generate is an observation and is skipped, not trained on and
never a step of the recursion: the next turn's prompt (not in the chain at all) and the tool
results merged into a turn (``completion_mask`` 0). So ``gamma`` discounts per generated token,
as verl's ``compute_gae_advantage_return`` and TRL's PPO do.

Names as verl and TRL: ``gamma``, ``lam``; whitening as their ``masked_whiten``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def chains(keys: Sequence[Hashable], turns: Sequence[int | None]) -> list[list[int]]:
    """Row indices grouped by ``keys`` (one chain per episode, agent and candidate), each in
    turn order; rows without a turn go first, then by turn, ties in row order. Chains come in
    the order of their first row."""
    by_key: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        by_key.setdefault(k, []).append(i)
    return [sorted(rows, key=lambda i: (-1 if turns[i] is None else turns[i], i))
            for rows in by_key.values()]


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float,
        lam: float, bootstrap: torch.Tensor | None = None
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both [B, T], for chains laid out as rows.

    ``rewards``, ``values``, ``mask``: [B, T]; ``mask`` 0 marks observations and padding, which
    the recursion passes over (their reward is ignored; advantage and return are 0 there).
    ``bootstrap`` [B]: the value after a chain's last token, for a chain cut before its end (a
    truncated episode); None or 0 for one that ended (terminal).

        delta_t = r_t + gamma * V(next trained token) - V_t
        A_t = delta_t + gamma * lam * A(next trained token),   returns_t = A_t + V_t
    """
    b, t = rewards.shape
    dtype = torch.promote_types(values.dtype, torch.float32)
    rewards, values = rewards.to(dtype), values.to(dtype)
    keep = mask.bool()
    next_value = (torch.zeros(b, dtype=dtype, device=values.device) if bootstrap is None
                  else bootstrap.to(dtype))
    last = torch.zeros(b, dtype=dtype, device=values.device)
    advantages = torch.zeros_like(values)
    for s in range(t - 1, -1, -1):
        m = keep[:, s]
        delta = rewards[:, s] + gamma * next_value - values[:, s]
        current = delta + gamma * lam * last
        advantages[:, s] = torch.where(m, current, torch.zeros_like(current))
        next_value = torch.where(m, values[:, s], next_value)
        last = torch.where(m, current, last)
    returns = torch.where(keep, advantages + values, torch.zeros_like(values))
    return advantages, returns


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / std`` over the elements in ``mask`` (unbiased variance, as TRL's and
    verl's ``masked_whiten``); 0 outside it. One element: centred only (its std is undefined)."""
    keep = mask.bool()
    n = keep.sum()
    if n == 0:
        return torch.zeros_like(x)
    mean = x[keep].mean()
    centred = torch.where(keep, x - mean, torch.zeros_like(x))
    if n < 2:
        return centred
    var = (centred ** 2).sum() / (n - 1)
    return centred * torch.rsqrt(var + eps)


def chain_gae(per_row_values: Sequence[torch.Tensor], per_row_mask: Sequence[torch.Tensor],
              per_row_reward: Sequence[float], rows_of_chains: Sequence[Sequence[int]], *,
              gamma: float, lam: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """GAE for transitions: each row's values and mask [C_i] (its completion tokens), its
    reward, and the chains (``chains``) the rows form. The reward goes on the row's last
    trained token (a row with none passes its reward to nobody). Returns each row's advantages
    and returns [C_i], not whitened; every chain ends (terminal)."""
    n_rows = len(per_row_values)
    advantages: list[torch.Tensor | None] = [None] * n_rows
    returns: list[torch.Tensor | None] = [None] * n_rows
    if not rows_of_chains:
        return [], []
    width = max(sum(per_row_values[i].numel() for i in rows) for rows in rows_of_chains)
    b = len(rows_of_chains)
    like = per_row_values[rows_of_chains[0][0]]
    dtype = torch.promote_types(like.dtype, torch.float32)
    values = torch.zeros(b, width, dtype=dtype, device=like.device)
    rewards = torch.zeros_like(values)
    mask = torch.zeros(b, width, dtype=torch.bool, device=like.device)
    for c, rows in enumerate(rows_of_chains):
        at = 0
        for i in rows:
            n = per_row_values[i].numel()
            m = per_row_mask[i].bool()
            values[c, at:at + n] = per_row_values[i]
            mask[c, at:at + n] = m
            trained = torch.nonzero(m).flatten()
            if trained.numel():
                rewards[c, at + int(trained[-1])] = per_row_reward[i]
            at += n
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    for c, rows in enumerate(rows_of_chains):
        at = 0
        for i in rows:
            n = per_row_values[i].numel()
            advantages[i], returns[i] = adv[c, at:at + n], ret[c, at:at + n]
            at += n
    if any(a is None for a in advantages):
        raise ValueError("every row must be in exactly one chain")
    return [a for a in advantages if a is not None], [r for r in returns if r is not None]
