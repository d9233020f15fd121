"""Baselines: what a transition's reward is compared with when its task never repeats.

Group-relative training compares rollouts of the same task; live traffic never repeats a
request, so every production episode is a group of one and gets advantage 0. A baseline says
which transitions a reward is compared with (their group id), tried in the order given, the
first that applies winning:

* ``group``: the transitions of its task (AT-GRPO: task, agent, turn; LightningRL: task), as
  today. When another baseline follows it applies only to groups of two or more.
* ``batch``: every transition of the same agent and turn in the conversion's output
  (the REINFORCE++ baseline): ``(r - mean) / std`` over the batch. Always applies.
* ``key:ATTRIBUTE``: episodes that share the value of ``ATTRIBUTE`` (a request type, a prompt
  template id recorded on the episode's spans; a span column name works too), per agent and
  turn, leave-one-out: ``r - mean(others)`` (over the group's std when scaling). Applies when
  the episode has the attribute.

``per_agent`` (Dr. MAS, arXiv 2602.08847) normalises with each agent's own statistics: the
group keeps the agent and drops the turn (a task's or batch's transitions of one agent).
A transition no baseline applies to is a group of its own: advantage 0, counted.

``group`` statistics are exact within a conversion unit (a task with its episodes); ``batch``
and ``key`` span the whole output, so the converter computes them in a last pass
(``global_advantages``) over every transition's reward and group id.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agl_bridge.trainer.arrow import lit, np_array
from agl_bridge.trainer.rewards.advantages import group_advantages
from agl_bridge.trainer.rewards.credit import AdvantageUnit, Algorithm

GROUP, BATCH = "group", "batch"
KEY_PREFIX = "key:"


def parse_baselines(spec: str | Sequence[str]) -> tuple[str, ...]:
    """``"group,batch"`` or ``["key:prompt_template", "batch"]`` -> checked names."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    if not names or any(not n for n in names):
        raise ValueError(f"baseline {spec!r}: expected group, batch or key:ATTRIBUTE, "
                         "comma-separated")
    for n in names:
        if n in (GROUP, BATCH):
            continue
        if n.startswith(KEY_PREFIX) and len(n) > len(KEY_PREFIX):
            continue
        raise ValueError(f"baseline {n!r}: expected group, batch or key:ATTRIBUTE")
    if len(set(names)) != len(names):
        raise ValueError(f"baseline {spec!r}: a baseline named twice")
    return tuple(names)


def key_attribute(baseline: str) -> str:
    return baseline[len(KEY_PREFIX):]


def _suffix(agent: pa.Array, turn: pa.Array, *, per_agent: bool) -> pa.Array:
    """``|agent:A|turn:N`` (``|agent:A`` with per-agent normalisation); None reads None."""
    a = pc.fill_null(agent, lit("None"))
    if per_agent:
        return pc.binary_join_element_wise(lit("|agent:"), a, lit(""))
    t = pc.fill_null(pc.cast(turn, pa.string()), lit("None"))
    return pc.binary_join_element_wise(lit("|agent:"), a, lit("|turn:"), t, lit(""))


def task_group_ids(task: pa.Array, episode: pa.Array, agent: pa.Array, turn: pa.Array,
                   algorithm: Algorithm, *, per_agent: bool = False) -> pa.Array:
    """The ``group`` baseline's ids: AT-GRPO ``task:T|agent:A|turn:N``; LightningRL
    ``task:T``; per-agent: ``task:T|agent:A``. Without a task id the episode stands in
    (``episode:E``), which makes a group of one."""
    task_part = pc.if_else(pc.is_valid(task),
                           pc.binary_join_element_wise(lit("task:"), task, lit("")),
                           pc.binary_join_element_wise(lit("episode:"), episode, lit("")))
    if algorithm == "lightning_rl" and not per_agent:
        return task_part
    return pc.binary_join_element_wise(task_part, _suffix(agent, turn, per_agent=per_agent),
                                       lit(""))


def batch_group_ids(agent: pa.Array, turn: pa.Array, *, per_agent: bool = False) -> pa.Array:
    return pc.binary_join_element_wise(lit(BATCH), _suffix(agent, turn, per_agent=per_agent),
                                       lit(""))


def key_group_ids(attribute: str, values: pa.Array, agent: pa.Array, turn: pa.Array,
                  algorithm: Algorithm, *, per_agent: bool = False) -> pa.Array:
    """``key:ATTRIBUTE=V|agent:A|turn:N`` (LightningRL: ``key:ATTRIBUTE=V``); null where the
    episode has no value."""
    head = pc.binary_join_element_wise(lit(f"{KEY_PREFIX}{attribute}="), values, lit(""))
    if algorithm == "lightning_rl" and not per_agent:
        return head
    return pc.binary_join_element_wise(head, _suffix(agent, turn, per_agent=per_agent),
                                       lit(""))


def choose(baselines: Sequence[str], candidates: Sequence[pa.Array],
           applies: Sequence[np.ndarray], group_sizes: np.ndarray, fallback: pa.Array
           ) -> tuple[pa.Array, np.ndarray]:
    """(group id, index of the baseline chosen, -1 for none) per transition: the first
    baseline that applies. ``candidates[i]``: baseline i's group ids, ``applies[i]`` where
    they apply; ``group_sizes``: transitions in each one's ``group`` group (it applies from
    two on when another baseline follows it); ``fallback``: a group of one each."""
    chosen = np.full(len(fallback), -1, np.int64)
    out = fallback
    for i in range(len(baselines) - 1, -1, -1):  # the first applicable wins: last to first
        valid = applies[i]
        if baselines[i] == GROUP and i < len(baselines) - 1:
            valid = valid & (group_sizes >= 2)
        if valid.any():
            out = pc.if_else(np_array(np.asarray(valid, bool)), candidates[i], out)
            chosen = np.where(valid, i, chosen)
    return out, chosen


def loo_advantages(reward: np.ndarray, group: np.ndarray, *, scale: bool = True,
                   eps: float = 1e-4) -> tuple[np.ndarray, int, int]:
    """Leave-one-out: ``r_i - mean(r_j, j != i)`` within each group (over the group's sample
    std when ``scale``); (advantages, groups, groups without signal: one member or equal
    rewards)."""
    reward = np.asarray(reward, np.float64)
    n = len(reward)
    out = np.zeros(n, np.float64)
    if n == 0:
        return out, 0, 0
    uniq, inv = np.unique(group, return_inverse=True)
    inv = inv.reshape(-1)
    k = len(uniq)
    count = np.bincount(inv, minlength=k)
    # exact group sums and spreads (math.fsum per group): shared with group_advantages
    base, _, _ = group_advantages(reward, inv, np.arange(n), scale=False, eps=eps)
    mean = reward - base  # the group mean per transition (0 advantage: mean = reward)
    lo, hi = np.full(k, np.inf), np.full(k, -np.inf)
    np.minimum.at(lo, inv, reward)
    np.maximum.at(hi, inv, reward)
    flat = (count[inv] < 2) | (lo[inv] == hi[inv])
    c = count[inv].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        others = (mean * c - reward) / (c - 1)  # the mean of the other members
        adv = reward - others
        if scale:
            std = np.sqrt(np.bincount(inv, weights=(reward - mean) ** 2, minlength=k)
                          / np.maximum(count - 1, 1))[inv]
            adv = adv / (std + eps)
    out = np.where(flat | ~np.isfinite(adv), 0.0, adv)
    return out, k, int(np.count_nonzero((count < 2) | (lo == hi)))


def global_advantages(group_id: Sequence[str], reward: np.ndarray, episode: np.ndarray, *,
                      unit: AdvantageUnit = "transition", scale: bool = True
                      ) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The last pass: advantages of the transitions in ``batch`` and ``key`` groups, over the
    whole output. (advantages, which transitions they are for, groups, groups without
    signal)."""
    ids = np.asarray(group_id, dtype=object)
    is_batch = np.array([g.startswith(BATCH + "|") for g in ids], bool)
    is_key = np.array([g.startswith(KEY_PREFIX) for g in ids], bool)
    out = np.zeros(len(ids), np.float64)
    groups = flat = 0
    for which in (is_batch, is_key):
        if which.any():
            sel = np.flatnonzero(which)
            codes = np.unique(ids[sel], return_inverse=True)[1].reshape(-1)
            out[sel], g, z = (group_advantages(reward[sel], codes, episode[sel], unit=unit,
                                               scale=scale) if which is is_batch
                              else loo_advantages(reward[sel], codes, scale=scale))
            groups, flat = groups + g, flat + z
    return out, is_batch | is_key, groups, flat
