"""The loop's prompt lever (``algorithm = "apo"``, or ``"apo+lora"`` in turn with training):
an APO round searches the agents' system prompts from the round's rewarded episodes, gates the
best candidates with the loop's gate, publishes them to the registry's prompt table, and the
watch rolls a prompt version back as it rolls back an adapter version.

A round, after the loop has collected it (the team played the round's training tasks on the
live adapters and prompts, the agents following the prompt table ``AGL_BRIDGE_PROMPTS``):

1. **watch** (every round, both levers): each episode's reward (conversion, with the loop's
   ``[convert]`` settings: inline, feedback, recipe) by the prompt versions its calls carried
   (``agl_bridge.prompt.version``); the prompt version published last is judged against the best
   of the last ``[watch] window`` prompt states with ``watch.py``, and rolled back (the
   registry's ``rollback``, live at the agents' next call) if worse beyond noise and margin;
2. **search** (``run.search_agent``, one agent after another): the round's episodes are what the
   first critique reads, the root is the live prompt scored by the round itself (no extra
   play), candidates play the first ``[apo] val_batch_size`` of the round's tasks as the round
   did (``rollouts`` at ``temperature``), each later agent against the earlier ones' winners;
   never on held-out tasks, so the gate's tasks stay unseen by the selection. On a live service
   (``traces``): the users' episodes since the last round are read (as text: no token ids
   needed), and the root and the candidates play the round's newest real inputs again (the
   replay command, ``replay_field``);
3. **gate**: the live prompts and the candidate table on the gate's held-out tasks, through the
   loop's own evaluation (cached per adapter and prompt versions), or on a live service with
   ``[gate] inputs = N`` on the round's N newest real inputs replayed (``Loop._replayed_scores``,
   as the adapter gate does), which the search and its critiques are not given;
   ``gate.decide`` with the ``[gate]`` rule: the team not worse beyond noise and each
   changed agent's own score not (``[gate] partial``: the agents that passed, when only some
   did);
4. **publish**: each winner the gate passed becomes its agent's next version (``solver@p2``)
   in the registry.

No torch, no LoRA serving: the team's endpoint and the optimizer's (``[apo]
optimizer_base_url``; default the loop's server, the base model as ``gradient_model``).
Prompt states are maps agent -> version over the loop's ``agents`` (``solver@p0``: the agent's
own prompt); an episode matches a state when every version it carries is the state's.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from agl_bridge.capture import CAPTURE_ENV
from agl_bridge.parquet_io import iter_parquet_files
from agl_bridge.prompts import PROMPTS_ENV, TABLE_KEY, version_name
from agl_bridge.settings import replace_text
from agl_bridge.trainer.judging.client import JudgeHTTPError
from agl_bridge.trainer.loop.apo.run import (
    Scoring,
    live_entries,
    optimizer_for,
    search_agent,
    write_prompt_table,
)
from agl_bridge.trainer.loop.apo.transcripts import (
    TextCopy,
    converted_rewards,
    result_rewards,
    transcripts,
)
from agl_bridge.trainer.loop.apo.versions import (
    episode_prompt_versions,
    key_versions,
    matches,
)
from agl_bridge.trainer.loop.gate import Scores
from agl_bridge.trainer.loop.state import LoopState
from agl_bridge.trainer.loop.team import read_results, read_tasks, role_scores, task_scores
from agl_bridge.trainer.loop.watch import best_recent, watch
from agl_bridge.trainer.serving.prompts import PromptRegistry
from agl_bridge.trainer.serving.registry import ALIASES_FILE

RECENT = 2000  # rewards kept per prompt-versions key for the watch
Entries = Mapping[str, Mapping[str, str]]  # a prompt table's entries: agent -> version, text


class LoopView(Protocol):
    """What the lever uses of the ``Loop`` that owns it. Typed by its shape: the engine imports
    this module, so this module imports nothing of the engine (nor ``LoopConfig``, whose module
    imports APO's settings)."""

    cfg: Any  # the LoopConfig
    registry: Path
    data: dict[str, Any]
    state: LoopState
    base_url: str

    def _decide(self, r: int, rdir: Path, record: dict[str, Any], changed: list[str],
                candidate: dict[str, str], prompts: Entries | None = None,
                inputs: list[dict[str, Any]] | None = None) -> list[str]: ...


class PromptLever:
    """The prompt side of a ``Loop``: its APO rounds, the prompt table its team runs follow,
    and the prompt watch. It drives the loop's own evaluation (``Loop._scores``), so gate
    scores are cached and timed with the adapter lever's."""

    def __init__(self, loop: LoopView, log: Callable[[str], None]) -> None:
        self.loop = loop
        self.log = log
        self.cfg = loop.cfg
        self.registry = PromptRegistry(loop.registry)
        loop.data.setdefault("prompt_rewards", {})  # prompt versions' key -> episode rewards
        self._rewards: dict[str, float] = {}  # this round's, per episode
        # the round's span files as text, read once for the wait, the watch and the search
        self.text = TextCopy()
        if self.cfg.traces is not None:  # a live service reads the table: an empty one at first
            self.env()

    def turn(self, r: int) -> bool:
        """Round ``r`` changes prompts (apo), not adapters."""
        return self.cfg.algorithm == "apo" or r % 2 == 0

    # -- the table team runs follow -----------------------------------------------------------
    def live(self) -> dict[str, dict[str, str]]:
        return live_entries(self.registry)

    def state(self) -> dict[str, str]:
        """Agent -> live prompt version, over the loop's agents (p0: the agent's own)."""
        live = self.registry.read_live()
        return {a: live.get(a, version_name(a, 0)) for a in self.cfg.agents}

    def key(self, entries: Entries | None = None) -> str:
        """What an evaluation's cache key adds for the prompts it ran with (the live table's
        when None): versions and a hash of each text, since a refused candidate's number is
        given again to the next candidate."""
        entries = self.live() if entries is None else entries
        parts = sorted(f"{e['version']}#{hashlib.sha256(e['text'].encode()).hexdigest()[:8]}"
                       for e in entries.values() if e.get("text"))
        return f" prompts {','.join(parts)}" if parts else ""

    def env(self, out: Path | None = None, entries: Entries | None = None) -> dict[str, str]:
        """For a team run: the prompt table (the registry's live one, or ``entries`` written
        under ``out``: a candidate's), and capture of the messages, which the critiques read."""
        path = self.registry.table_path if entries is None or out is None else \
            write_prompt_table(out, entries)
        if entries is None and not path.exists():
            with self.registry.registry.locked():  # an empty table: every agent on its own
                if not path.exists():
                    path.parent.mkdir(parents=True, exist_ok=True)
                    replace_text(path, json.dumps({TABLE_KEY: {}}))
        return {PROMPTS_ENV: str(path),
                CAPTURE_ENV: os.environ.get(CAPTURE_ENV) or "messages"}

    # -- the watch ----------------------------------------------------------------------------
    def watch(self, r: int, rdir: Path, record: dict[str, Any], sources: list[Path]) -> None:
        """The round's episodes' rewards (``sources``: the team's spans, or a live service's
        new span files) by the prompt versions that served them; the prompt version published
        last is judged against the best recent prompt state and rolled back if it is worse
        beyond noise and the margin (as ``Loop._watch`` judges adapters)."""
        log = self.log
        cfg, data = self.cfg, self.loop.data
        record["lever"] = "apo" if self.turn(r) else "lora"
        self._rewards = {}
        if any(True for _ in iter_parquet_files(sources)):
            readable, _ = self.text.of(sources)  # no token ids needed
            self._rewards = converted_rewards(readable, cfg.convert, evaluations_from=cfg.traces)
        if not self._rewards and (rdir / "results.jsonl").exists():  # the team's own scores
            self._rewards = result_rewards(read_results(rdir / "results.jsonl"))
        kept_all = data["prompt_rewards"]
        for episode, key in episode_prompt_versions(sources).items():
            if episode in self._rewards:
                kept = kept_all.setdefault(key, [])
                kept.append(self._rewards[episode])
                del kept[:-RECENT]
        last = self.unjudged()
        if last is None:
            return
        current = {**last["previous"], **last["versions"]}
        published = [e for e in data["events"] if e["event"] == "prompt published"]

        def rewards_of(state: Mapping[str, str]) -> list[float]:
            return [x for key, xs in kept_all.items() if matches(key_versions(key), state)
                    for x in xs]

        recent = [e["previous"] for e in published[-cfg.watch.window:]]
        target = recent[best_recent([(json.dumps(s), rewards_of(s)) for s in recent])]
        decision = watch(rewards_of(target), rewards_of(current), margin=cfg.watch.margin,
                         min_episodes=cfg.watch.episodes)
        record["prompt_watch"] = {**decision.as_dict(), "against": target}
        if decision.verdict == "wait":
            return
        last["watched"] = decision.verdict
        if decision.verdict == "rollback":
            log(f"watch: rolling back prompts {last['versions']} -> {target}: "
                f"{decision.reason}")
            with self.loop.state.timed("publish"):
                for agent, name in target.items():
                    if self.state().get(agent) != name:
                        self.registry.rollback(agent, name)
            data["events"].append({"round": r, "event": "prompt rolled back",
                                   "from": last["versions"], "to": target,
                                   "reason": decision.reason, "time": time.time()})
            record["prompt_rolled_back"] = True

    def unjudged(self) -> dict[str, Any] | None:
        """The last prompt publish while its versions are live and the watch has not judged
        them yet (kept or rolled back)."""
        published = [e for e in self.loop.data["events"] if e["event"] == "prompt published"]
        if not published or published[-1].get("watched"):
            return None
        last = published[-1]
        return last if {**last["previous"], **last["versions"]} == self.state() else None

    def holds(self, r: int, record: dict[str, Any], sources: list[Path]) -> bool:
        """One change at a time, as for adapters: while the prompt version published last is
        live and not judged, nothing is searched, trained or published (a lora round's
        episodes are trained on in the next round that trains)."""
        log = self.log
        last = self.unjudged()
        if last is None:
            return False
        watched = record.get("prompt_watch") or {"reason": "not watched yet"}
        record["held"] = (f"the watch has not judged prompts {', '.join(last['versions'].values())}"
                          f" yet: {watched['reason']}")
        record.setdefault("watch", watched)  # what a held round's summary shows
        if not self.turn(r):
            self.loop.data.setdefault("held_sources", []).extend(str(s) for s in sources)
        log(f"round {r}: nothing searched, trained or published: {record['held']}")
        return True

    # -- an APO round -------------------------------------------------------------------------
    def round(self, r: int, rdir: Path, record: dict[str, Any], sources: list[Path]) -> None:
        """Search each agent's prompt from the round's episodes, gate the winners together,
        publish them."""
        loop, cfg, log = self.loop, self.cfg, self.log
        if record.get("prompt_rolled_back"):  # the round's episodes are the rolled-back one's
            log(f"round {r}: prompts rolled back; the next APO round searches from those live")
            record["published"] = {}
            return
        root_scores: Scores | None
        gate_inputs: list[dict[str, Any]] = []  # [gate] inputs: held out of the search
        rewards, replays_held = self._rewards, set[str]()
        if cfg.traces is None:  # the team played the round's tasks: they score the root
            results = read_results(rdir / "results.jsonl")
            tasks = read_tasks(rdir / "tasks.jsonl")[:cfg.apo.val_batch_size]  # as written
            ids = {t["task_id"] for t in tasks}
            mine = [x for x in results if x.get("task_id") in ids]
            root_scores = Scores(task_scores(mine), role_scores(mine))
            command, played = cfg.team or "", "of the round's tasks"
        else:  # live: the newest real inputs of the round, played again by the root too
            tasks, root_scores = self._live_inputs(rdir, sources), None
            if cfg.gate.inputs and cfg.gate.rule != "off":
                tasks, gate_inputs = tasks[:-cfg.gate.inputs], tasks[-cfg.gate.inputs:]
                held = {t["source_episode"] for t in gate_inputs}
                rewards = {e: x for e, x in rewards.items() if e not in held}
                replays_held = {t["task_id"] for t in gate_inputs}  # replay_k's of them
            tasks = tasks[-cfg.apo.val_batch_size:]
            command, played = cfg.replay_team or cfg.eval_team or "", "real inputs replayed"
            if not tasks:
                log(f"round {r}: APO has no input of the round's episodes to play "
                    f"candidates on (replay_field {cfg.replay_field!r}"
                    + (f"; the newest {len(gate_inputs)} are the gate's" if gate_inputs
                       else "") + ")")
                record["apo"], record["published"] = {}, {}
                return
        scoring = Scoring(command, tasks, loop.base_url, loop.registry / ALIASES_FILE,
                          cfg.rollouts, cfg.temperature,
                          {**self.env(), "AGL_BRIDGE_MAX_TOKENS": str(cfg.max_tokens)})
        optimizer = optimizer_for(cfg.apo, loop.base_url)
        # episodes are captured with their messages (``env``); ids only, if the user chose so
        ids_only = os.environ.get(CAPTURE_ENV, "messages") != "messages"
        tokenizer = cfg.model if ids_only and cfg.model else None
        rng = random.Random(cfg.apo.seed + r)
        live, before = self.live(), self.state()
        pending: dict[str, dict[str, str]] = {}
        record["apo"] = {}
        log(f"round {r}: APO on {', '.join(cfg.agents)} from {len(rewards)} rewarded "
            f"episodes, candidates on {len(tasks)} {played} ...")
        source = cfg.traces or str(rdir / "spans")
        with loop.state.timed("apo search"):
            readable, _ = self.text.of(sources)  # the watch's copy, unless it read none
            for agent in cfg.agents:
                try:
                    pool = [t for t in transcripts(readable, rewards,
                                                   max_chars=cfg.apo.max_episode_chars,
                                                   tokenizer=tokenizer, agent=agent)
                            if t.task not in replays_held]
                    if not pool:
                        raise ValueError(f"every rewarded episode of {agent} replays one of "
                                         f"the gate's inputs")
                except (ValueError, FileNotFoundError) as exc:
                    log(f"round {r}: APO skips {agent}: {str(exc).splitlines()[0]}")
                    record["apo"][agent] = {"skipped": str(exc)[:300]}
                    continue
                try:
                    found = search_agent(
                        agent, pool, search=cfg.apo, registry=self.registry,
                        optimizer=optimizer, scoring=scoring, work=rdir / "apo" / agent,
                        rng=rng, others={**live, **pending}, source=source,
                        log=lambda m: log(f"round {r} apo: {m}"),
                        root_scores=None if pending else root_scores)
                except JudgeHTTPError as exc:  # the optimizer failed: this agent waits
                    log(f"round {r}: APO skips {agent}: the optimizer failed: {exc}")
                    record["apo"][agent] = {"failed": str(exc)[:300]}
                    continue
                record["apo"][agent] = {
                    "root": found.root_version, "root_score": found.root.mean,
                    "best": found.winner.id, "best_score": found.winner.mean,
                    "candidates": len(found.tried)}
                if found.improved:
                    pending[agent] = {"version": found.trial_version, "text": found.winner.text}
        if not pending:
            log(f"round {r}: no candidate beat the live prompts on the round's tasks")
            record["published"] = {}
            return
        candidate = {**live, **pending}
        record["candidate"] = {a: e["version"] for a, e in pending.items()}
        # the gate plays the candidate table on the live adapters: held-out tasks, or the
        # round's newest real inputs (gate_inputs), which the search never saw
        chosen = loop._decide(r, rdir, record, list(pending), dict(loop.data["live"]),
                              candidate, gate_inputs)
        refused = {a: v for a, v in record["candidate"].items() if a not in chosen}
        if refused:
            loop.data["events"].append({"round": r, "event": "prompt refused",
                                        "candidate": refused,
                                        "reason": record["gate"]["rule"]})
        if not chosen:
            return
        published = {}
        with loop.state.timed("publish"):
            for agent, entry in pending.items():
                if agent not in chosen:
                    continue
                info = record["apo"][agent]
                published[agent] = self.registry.publish(agent, entry["text"], note=(
                    f"loop round {r}: {info['best']}, {info['best_score']:.3f} vs "
                    f"{info['root_score']:.3f} ({info['root']}) on the round's tasks")).name
        record["published"] = published
        loop.data["events"].append({"round": r, "event": "prompt published",
                                    "versions": published, "previous": before,
                                    "reason": record["gate"]["rule"], "time": time.time()})

    def _live_inputs(self, rdir: Path, sources: list[Path]) -> list[dict[str, Any]]:
        """The inputs of the live service's episodes this round (not of the loop's own
        replays), oldest first, as tasks the replay command plays."""
        from agl_bridge.trainer.loop.replay import read_replay_spans, replay_inputs

        live = [s for s in sources if rdir.resolve() not in Path(s).resolve().parents]
        if not live:
            return []
        inputs = replay_inputs(read_replay_spans(live, self.cfg.replay_field),
                               field_name=self.cfg.replay_field)
        return inputs.tasks
