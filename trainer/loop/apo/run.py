"""``agl-bridge apo``: a batch job over stored traces that proposes, scores, gates and publishes
prompt versions, one agent after another.

For each agent: its live prompt (the registry's live version, else its own prompt as the
traces show it, kept as p0) is the root; the stored rewarded episodes are what the first
critique reads; the beam search (``search.py``) scores every candidate by running the team
command on the first ``val_batch_size`` held-out tasks with a prompt table that gives the agent
the candidate (``AGL_BRIDGE_PROMPTS``; the other agents keep their live prompts), and a
candidate's own held-out episodes are what its critique reads. The best candidate goes through
the gate (``gate.py``'s pure functions, on the same tasks) against the root and is published
only if it is not worse beyond noise. Everything is kept under the work directory: each
candidate's text, scores, critique and diff against the root (``candidates.jsonl``,
``<id>/prompt.txt``, ``<id>/diff.txt``), and the decision (``apo.json``).

No torch, no LoRA serving: an OpenAI-compatible endpoint for the team and one for the optimizer.
"""

from __future__ import annotations

import difflib
import json
import os
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agl_bridge.prompts import PROMPTS_ENV, TABLE_KEY, parse_prompts, version_name
from agl_bridge.trainer.loop.apo.config import ApoConfig, ApoSearchConfig
from agl_bridge.trainer.loop.apo.optimizer import Optimizer
from agl_bridge.trainer.loop.apo.search import Candidate, beam_search, best
from agl_bridge.trainer.loop.apo.transcripts import (
    Transcript,
    best_and_worst,
    converted_rewards,
    result_rewards,
    text_traces,
    transcripts,
)
from agl_bridge.trainer.loop.gate import Scores, decide
from agl_bridge.trainer.loop.team import read_tasks, role_scores, run_team, task_scores
from agl_bridge.trainer.serving.prompts import PromptRegistry


class ApoError(ValueError):
    """A run that cannot start or go on; the message names the setting or file."""


@dataclass
class AgentOutcome:
    agent: str
    root: str  # the live version the search started from
    best: str  # the best candidate's id
    published: str | None  # the version published, or None
    gate: dict[str, Any] = field(default_factory=dict)
    candidates: int = 0


def _diff(old: str, new: str, a: str, b: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True), fromfile=a, tofile=b))


def _tasks(path: str, n: int) -> list[dict[str, Any]]:
    try:
        tasks = read_tasks(path)
    except OSError as exc:
        raise ApoError(f"val_tasks {path}: cannot be read ({exc.strerror})") from None
    except ValueError as exc:
        raise ApoError(f"val_tasks {exc}") from None
    if not tasks:
        raise ApoError(f"val_tasks {path}: no task")
    return tasks[:n]


def run_apo(traces: str | Path, config: ApoConfig, workdir: str | Path, *,
            optimizer: Optimizer | None = None, aliases: Path | None = None,
            log: Callable[[str], None] = lambda m: print(f"apo: {m}", file=sys.stderr)
            ) -> list[AgentOutcome]:
    """Optimise each of ``config.agents``' prompts in turn; see the module's docstring.
    ``aliases``: the alias table the team's held-out runs follow (the loop's live adapters;
    unset: whatever ``AGL_BRIDGE_ALIASES`` this process has)."""
    missing = config.missing()
    if missing:
        raise ApoError(f"apo needs {', '.join(missing)} (flags or --config)")
    assert config.registry and config.team and config.val_tasks and config.base_url
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    registry = PromptRegistry(config.registry)
    scoring = Scoring(config.team, _tasks(config.val_tasks, config.val_batch_size),
                      config.base_url, aliases, config.rollouts, config.temperature)
    optimizer = optimizer or optimizer_for(config, config.base_url)
    rng = random.Random(config.seed)
    outcomes = []
    with text_traces(traces) as (readable, without_ids):
        if without_ids:
            log(f"{without_ids} LLM calls have no token ids (a hosted API, another "
                f"instrumentor): read as text")
        stored = converted_rewards(readable)
        pools = {agent: transcripts(readable, stored, max_chars=config.max_episode_chars,
                                    tokenizer=config.tokenizer, agent=agent)
                 for agent in config.agents}
    for agent in config.agents:
        searched = search_agent(agent, pools[agent], search=config, registry=registry,
                                optimizer=optimizer, scoring=scoring, work=work / agent,
                                rng=rng, others=live_entries(registry), source=str(traces),
                                log=log)
        outcomes.append(_gate_and_publish(searched, config, registry, work / agent, log))
    (work / "apo.json").write_text(json.dumps(
        [o.__dict__ for o in outcomes], indent=2))
    return outcomes


def optimizer_for(search: ApoSearchConfig, base_url: str) -> Optimizer:
    """The optimizer the settings name (its endpoint: ``optimizer_base_url``, else the
    team's)."""
    return Optimizer(search.optimizer_base_url or base_url, search.gradient_model,
                     search.apply_edit_model or search.gradient_model,
                     api_key=os.environ.get("OPENAI_API_KEY"), timeout_s=search.timeout)


@dataclass(frozen=True)
class Scoring:
    """How a candidate is scored: the team command on ``tasks``, ``rollouts`` times each at
    ``temperature``, following the alias table ``aliases``, with a prompt table that gives the
    agent the candidate."""

    team: str
    tasks: list[dict[str, Any]]
    base_url: str
    aliases: Path | None
    rollouts: int = 1
    temperature: float = 0.0
    extra_env: Mapping[str, str] = field(default_factory=dict)  # e.g. the loop's max tokens


@dataclass
class Searched:
    """One agent's search: where it started, every candidate tried, the best."""

    agent: str
    root_version: str  # the live version the search started from
    trial_version: str  # the name a winner would be published under (what its spans record)
    root: Candidate
    tried: list[Candidate]
    winner: Candidate

    @property
    def improved(self) -> bool:
        return self.winner is not self.root


def live_entries(registry: PromptRegistry) -> dict[str, dict[str, str]]:
    """The prompt table's entries for every agent's live version, as the table holds them (p0:
    no text, the agent's own prompt)."""
    entries: dict[str, dict[str, str]] = {}
    for agent, name in registry.read_live().items():
        text = registry.text(agent, name) if not name.endswith("@p0") else None
        entries[agent] = {"version": name, **({"text": text} if text else {})}
    return entries


def write_prompt_table(out: Path, entries: Mapping[str, Mapping[str, str]]) -> Path:
    """A candidate's prompt table (checked as agents will read it), for one evaluation."""
    table = {TABLE_KEY: {a: dict(e) for a, e in entries.items()}}
    parse_prompts(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prompts.json").write_text(json.dumps(table, indent=2))
    return out / "prompts.json"


def search_agent(agent: str, pool: list[Transcript], *, search: ApoSearchConfig,
                 registry: PromptRegistry, optimizer: Optimizer, scoring: Scoring, work: Path,
                 rng: random.Random, others: Mapping[str, dict[str, str]], source: str,
                 log: Callable[[str], None], root_scores: Scores | None = None) -> Searched:
    """The beam search for ``agent``'s prompt from its live version, on ``pool`` (its rewarded
    episodes) and ``scoring``'s tasks; ``others``: the table entries the other agents get while
    a candidate plays. ``root_scores``: the live version's scores on those tasks when they are
    known (the loop's round played them), so the root is not played again. Every candidate is
    kept under ``work`` (``candidates.jsonl``, ``<id>/prompt.txt``, ``<id>/diff.txt``)."""
    live = registry.read_live()
    root_version = live.get(agent, version_name(agent, 0))
    root_text = registry.text(agent, root_version)
    if root_text is None:  # p0, never recorded: the agent's own prompt, as its episodes show
        root_text = next((t.system for t in pool if t.system), None)
        if root_text is not None:
            registry.record_original(agent, root_text, note=f"seen in {source}")
        else:  # the agent runs without a system prompt: the search proposes one
            root_text = ""
    log(f"{agent}: {len(pool)} rewarded episodes; root {root_version}")
    # the number a winner would be published as: what candidates' spans record
    trial_version = version_name(agent, 1 + max(
        [int(root_version.rsplit("@p", 1)[1])]
        + [v.number for v in registry.read_history().get(agent, [])]))

    def evaluate(c: Candidate) -> tuple[Scores, list[Transcript]]:
        if c.id == "root" and root_scores is not None:
            return root_scores, pool
        out = work / c.id
        entries = {**others}
        entries[agent] = ({"version": root_version} if c.id == "root" and root_version.endswith(
            "@p0") else {"version": root_version if c.id == "root" else trial_version,
                         "text": c.text})
        table = write_prompt_table(out, entries)
        run = run_team(scoring.team, scoring.tasks, out, base_url=scoring.base_url,
                       aliases=scoring.aliases, rollouts=scoring.rollouts,
                       temperature=scoring.temperature, service=f"apo-{agent}",
                       extra_env={**scoring.extra_env, PROMPTS_ENV: str(table),
                                  "AGL_BRIDGE_CAPTURE": "messages"})
        scores = Scores(task_scores(run.results), role_scores(run.results))
        try:
            own = transcripts(run.spans, result_rewards(run.results)
                              or converted_rewards(run.spans),
                              max_chars=search.max_episode_chars, agent=agent)
        except (ValueError, FileNotFoundError):
            own = []  # its critique reads the stored episodes instead
        return scores, own

    def critique(c: Candidate) -> str:
        good, bad = best_and_worst(c.episodes or pool, search.gradient_batch_size, rng)
        return optimizer.critique(agent, c.text, good, bad)

    def rewrite(c: Candidate, text: str) -> str | None:
        return optimizer.rewrite(agent, c.text, text, search.diversity_temperature)

    root = Candidate("root", root_text, 0, episodes=pool)
    tried = beam_search(root, evaluate=evaluate, critique=critique, rewrite=rewrite,
                        beam_width=search.beam_width, branch_factor=search.branch_factor,
                        rounds=search.beam_rounds, log=lambda m: log(f"{agent}: {m}"))
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "candidates.jsonl", "w") as f:
        for c in tried:
            diff = _diff(root.text, c.text, root_version, c.id)
            (work / c.id).mkdir(exist_ok=True)
            (work / c.id / "prompt.txt").write_text(c.text)
            (work / c.id / "diff.txt").write_text(diff)
            f.write(json.dumps({**c.as_dict(), "diff": diff}) + "\n")
    return Searched(agent, root_version, trial_version, root, tried, best(tried))


def _gate_and_publish(searched: Searched, config: ApoConfig, registry: PromptRegistry,
                      work: Path, log: Callable[[str], None]) -> AgentOutcome:
    """The batch job's gate: the best candidate against the root on the tasks it was scored
    on; published if it passes (and ``publish``)."""
    agent, root, winner = searched.agent, searched.root, searched.winner
    outcome = AgentOutcome(agent, searched.root_version, winner.id, None,
                           candidates=len(searched.tried))
    if not searched.improved:
        log(f"{agent}: no candidate beat {searched.root_version} ({root.mean:.3f}); nothing "
            f"published")
        return outcome
    assert root.scores is not None and winner.scores is not None
    verdict = decide(root.scores, winner.scores, [agent], rule=config.rule,
                     tolerance=config.tolerance)
    ok = verdict.publish
    outcome.gate = {"publish": ok, "team": verdict.team.as_dict(),
                    "roles": {r: d.as_dict() for r, d in verdict.roles.items()}}
    log(f"{agent}: gate {'passed' if ok else 'refused'} {winner.id}: {verdict.team.rule}")
    if ok and config.publish:
        version = registry.publish(agent, winner.text, note=(
            f"apo {work}: {winner.id}, held-out {winner.mean:.3f} vs {root.mean:.3f} "
            f"({searched.root_version}) on {verdict.team.n} tasks"))
        outcome.published = version.name
        log(f"{agent}: published {version.name}")
    return outcome
