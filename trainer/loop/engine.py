"""``agl-bridge loop``: train on what the team did, gate the candidate, publish, watch, repeat.

Each round:

1. **collect**: the loop runs the team command on the next training tasks (``team`` +
   ``tasks``), or waits until the user's service has written enough new rewarded episodes to a
   live trace directory (``traces``; a span file is used once ``settle_s`` old, so feedback that
   follows an episode has time to arrive);
2. **watch**: the live rewards those episodes got, by the adapter version that served them; if
   the version published last does worse than the best recent one beyond noise (and
   ``watch.margin``; ``watch.py``), it is rolled back, and the reason recorded. Until it has
   served ``watch.episodes`` rewarded episodes and been judged, the round stops here: nothing
   is trained or published, and the round's episodes are kept for the next (one change at a
   time, so a version is never replaced before its users' rewards have been compared);
3. **train**: ``train_from_traces`` from the live adapters (rewards inline, feedback, recipe,
   judges' scores; the configured baseline);
4. **gate**: the candidate is served under its own version name and evaluated on the held-out
   tasks beside the live version (``gate.py``); refused, it is unloaded and never goes live;
5. **publish**: the aliases the agents ask for switch to the candidate.

Everything is recorded in ``<workdir>/state.json`` after each stage; a stopped loop goes on
from there (a round cut short starts again). ``report.html`` shows rewards per version, the
gate's decisions, rollbacks and the time per stage.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agl_bridge.settings import values
from agl_bridge.trainer.loop.config import LoopConfig
from agl_bridge.trainer.loop.gate import Scores, decide
from agl_bridge.trainer.loop.state import LOOP_LOCK, LoopState, wipe
from agl_bridge.trainer.loop.team import TeamRun, read_tasks, role_scores, run_team, task_scores
from agl_bridge.trainer.loop.watch import best_recent, watch
from agl_bridge.trainer.serving.prompts import PROMPT_HISTORY_FILE, PROMPTS_DIR, PROMPTS_FILE
from agl_bridge.trainer.serving.registry import ALIASES_FILE
from agl_bridge.trainer.training.config import NothingToTrain

if TYPE_CHECKING:
    from agl_bridge.trainer.conversion.sources import Source
    from agl_bridge.trainer.loop.apo.rounds import PromptLever

BASE = "base"  # the base model's served name, which every alias points at first
RECENT = 2000  # rewards kept per version for the watch


def log(msg: str) -> None:
    print(f"[loop {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def start_vllm(cfg: LoopConfig) -> Any:
    """vLLM serving the base model as ``base`` (its log: ``WORKDIR/vllm.log``), leaving GPU
    memory to the training that runs beside it."""
    from agl_bridge.trainer.serving.vllm_server import VLLMServer, has_cuda

    log(f"starting vLLM on {Path(cfg.model).name} (log: {cfg.work / 'vllm.log'})")
    gpu = ["--gpu-memory-utilization", "0.35"] if has_cuda() else []
    return VLLMServer(cfg.model, served_model_name=BASE, log_path=cfg.work / "vllm.log",
                      **cfg.serve.server_options(*gpu)).start()


def mean_per_task(values: dict[str, list[float]]) -> dict[str, float]:
    return {t: math.fsum(v) / len(v) for t, v in values.items()}


def version_key(aliases: dict[str, str]) -> str:
    """The live versions of all agents as one key (``checker@v2,solver@v2``)."""
    return ",".join(sorted(set(aliases.values())))


def episode_versions(transitions: Path) -> dict[str, tuple[str, float]]:
    """Episode id -> (version key, mean reward), from a transitions file (the key: the policy
    versions that served the episode's calls)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(transitions, columns=["episode_id", "policy_version", "reward"])
    by_episode: dict[str, tuple[set[str], list[float]]] = {}
    for e, v, r in zip(*(rows[c].to_pylist() for c in ("episode_id", "policy_version",
                                                        "reward"))):
        if r is None:
            continue
        versions, rewards = by_episode.setdefault(e, (set(), []))
        versions.add(v or BASE)
        rewards.append(r)
    return {e: (",".join(sorted(versions)), math.fsum(rewards) / len(rewards))
            for e, (versions, rewards) in by_episode.items() if rewards}


SHARED_ADAPTER = "policy"  # the adapter a shared policy trains (train_from_traces' adapter_name)


class LoopCallback:
    """Told what the loop does as it runs, as TRL's ``TrainerCallback`` is told of training:
    subclass and override what you need (all do nothing here). A callback may add to
    ``loop.data`` (saved in ``state.json`` after it returns) and to a round's ``record``."""

    def on_train_begin(self, loop: Loop) -> None:
        """A round is about to convert and train (after its episodes were collected)."""

    def on_train_end(self, loop: Loop) -> None:
        """That training ended (trained, or nothing to train on, or failed)."""

    def on_evaluate(self, loop: Loop, label: str, out: Path) -> None:
        """The held-out evaluation ``label`` (``baseline``, ``final``) ran; the team's
        per-episode results are in ``out / "results.jsonl"``."""

    def on_round_end(self, loop: Loop, directory: Path, record: dict[str, Any]) -> None:
        """Round ``record["round"]`` ended; its files are under ``directory``."""


class Loop:
    """One loop over a workdir (``LoopConfig``); ``run()`` returns the state's data."""

    def __init__(self, cfg: LoopConfig, *, fresh: bool = False,
                 callbacks: Sequence[LoopCallback] = ()) -> None:
        self.cfg = cfg.check()
        self.work = cfg.work
        self.registry = Path(cfg.serve.registry or self.work / "registry")
        # one loop per workdir and per registry, before anything is read or wiped (--fresh)
        self._locks = [_exclusive(self.work / LOOP_LOCK, f"workdir {self.work}")]
        try:
            if self.registry.resolve() != self.work:
                self._locks.append(_exclusive(self.registry / LOOP_LOCK,
                                              f"registry {self.registry}"))
        except ValueError:
            self.release()
            raise
        self.state = LoopState(self.work, cfg.settings(), fresh)
        self.callbacks = list(callbacks)
        self.data = self.state.data
        self.data.setdefault("live", {a: BASE for a in cfg.agents})
        self.data.setdefault("evals", {})  # version key -> task -> score
        self.data.setdefault("rewards", {})  # version key -> recent per-episode rewards
        self.data.setdefault("events", [])  # publishes, refusals, rollbacks, with reasons
        self.data.setdefault("consumed", [])  # live: span files already trained on
        self.data.setdefault("next_task", 0)
        self.server: Any = None
        self._fresh: list[Path] = []  # the span files a live round collected
        self.base_url = cfg.server or ""
        self.prompts: PromptLever | None = None  # algorithm apo, apo+lora: prompt versions
        if cfg.algorithm != "lora":
            from agl_bridge.trainer.loop.apo.rounds import PromptLever

            self.prompts = PromptLever(self, log)

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        if self.data["resumed"]:
            log(f"resuming {self.work}: {len(self.data['rounds'])} round(s) done, "
                f"{self.state.elapsed / 60:.1f} min spent")
        if self._complete():
            log("this run is complete; rewriting its report (--rounds or --minutes to go on)")
            self.release()
            return self.data
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            with self._serving():
                self._evaluate("baseline")
                while self._budget_allows():
                    if not self._round(len(self.data["rounds"])):
                        break
                self._evaluate("final")
                self.data["final"]["budget"] = [self.cfg.rounds, self.cfg.minutes]
                self.state.save()
        except KeyboardInterrupt:
            log(f"stopped; run the same command again to go on from {self.state.path}")
            raise SystemExit(130) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.release()
        return self.data

    def release(self) -> None:
        """Let another loop have this workdir and registry (also done by the kernel when this
        process ends, however it ends)."""
        while self._locks:
            os.close(self._locks.pop())

    def _complete(self) -> bool:
        final = self.data.get("final")
        return bool(final and final.get("after_rounds") == len(self.data["rounds"])
                    and final.get("budget") == [self.cfg.rounds, self.cfg.minutes])

    def _budget_allows(self) -> bool:
        done = self.data["rounds"]
        if len(done) >= self.cfg.rounds:
            return False
        per_round = [r["seconds"] for r in done[-2:]]
        estimate = max(per_round) if per_round else 0.0
        evals = self.data.get("baseline", {}).get("seconds", 0.0) * 1.5 + 10
        if self.state.elapsed + estimate + evals > self.cfg.minutes * 60:
            log(f"stopping before round {len(done)}: {self.state.elapsed / 60:.1f} min spent, a "
                f"round takes about {estimate / 60:.1f} min, the final evaluation about "
                f"{evals / 60:.1f} min, budget {self.cfg.minutes:.0f} min")
            return False
        return True

    @contextmanager
    def _serving(self) -> Iterator[None]:
        """The vLLM server (started here unless one was given) and the publisher; the live
        versions recorded in the state are loaded again into a fresh server."""
        from agl_bridge.aliases import AliasTable
        from agl_bridge.trainer.serving.publisher import Publisher

        if self.cfg.server is None:
            # it lives as long as the server (its lock stays); prompt versions outlive it
            wipe(self.registry, keep=(PROMPTS_FILE, PROMPT_HISTORY_FILE, PROMPTS_DIR))
            with self.state.timed("start vLLM"):
                self.server = start_vllm(self.cfg)
            self.base_url = self.server.base_url
        try:
            self.publisher = Publisher([self.base_url], self.registry, base_model=self.cfg.model,
                                       max_lora_rank=self.cfg.serve.max_lora_rank, drain_s=2.0)
            table = AliasTable(self.registry / ALIASES_FILE)
            if self.server is not None or not table.path.exists():
                table.write({a: BASE for a in self.cfg.agents})
                if any(v != BASE for v in self.data["live"].values()):
                    with self.state.timed("publish"):  # a fresh server: the live versions again
                        for alias, name in self.data["live"].items():
                            if name != BASE:
                                self.publisher.publish(self._adapter_dir(alias, name), alias=alias)
            else:
                self._adopt()
            left = [n for n in self.data.pop("candidates_loaded", [])  # a kill during a gate
                    if n not in self.data["live"].values()]
            if left and self.server is None:
                log(f"unloading candidate(s) a stopped run left loaded: {', '.join(left)}")
                self._unload(left)
            yield
        finally:
            if self.server is not None:
                self.server.stop()

    def _adopt(self) -> None:
        """A registry filled before this loop (``agl-bridge publish``, another run): the live
        versions of the named agents are where it starts, trained on from their adapters. Each
        version the registry recorded keeps its number here (a link to its directory), so the
        next version trained follows them and no served name is used twice; a number this
        workdir holds as another adapter is refused now, before any waiting or training."""
        from agl_bridge.trainer.serving.registry import version_number

        history, live = self.publisher.store.read_history(), self.publisher.store.read_aliases()
        for alias in self.cfg.agents:
            for v in history.get(alias, []):
                number = version_number(v.name)
                if number is None:
                    continue
                here = self._adapter_dir(alias, v.name)
                if here.exists() or here.is_symlink():
                    if here.resolve() != Path(v.directory).resolve():
                        raise ValueError(
                            f"registry {self.registry}: {v.name} is {v.directory}, but this "
                            f"workdir's {here} is another adapter; train on from the registry "
                            f"in a new --workdir (or with --fresh), or use another registry")
                    continue
                here.parent.mkdir(parents=True, exist_ok=True)
                if Path(v.directory).is_dir():
                    here.symlink_to(Path(v.directory).resolve(), target_is_directory=True)
                else:  # gone: the number stays taken, so nothing is published under it again
                    here.mkdir()
                    (here / "PUBLISHED_ELSEWHERE").write_text(f"{v.name}: {v.directory}\n")
            name = live.get(alias)
            if name and name != BASE and self.data["live"].get(alias) == BASE:
                self.data["live"][alias] = name
                log(f"{alias}: starting from {name}, live in the registry {self.registry}")
        self.state.save()

    def _adapter_dir(self, alias: str, name: str) -> Path:
        from agl_bridge.trainer.serving.registry import version_number

        number = version_number(name)
        owner = SHARED_ADAPTER if self.cfg.train.policy == "shared" else alias
        return self.work / "adapters" / owner / f"v{number:04d}"

    def _agent_adapters(self, adapters: dict[str, str]) -> dict[str, str]:
        """Agent -> adapter directory to gate and publish. A shared policy trains one adapter
        (``SHARED_ADAPTER``) that every trained agent serves under its own alias; it was
        published to none, so that arm's team stayed on the base model."""
        if self.cfg.train.policy != "shared" or SHARED_ADAPTER not in adapters:
            return adapters
        agents = self.cfg.train.train_agents or list(self.data["live"])
        return {a: adapters[SHARED_ADAPTER] for a in agents}

    # -- one round ---------------------------------------------------------------------------
    def _round(self, r: int) -> bool:
        """Returns False when there is nothing more to learn from (no tasks left)."""
        t0 = time.perf_counter()
        rdir = self.work / f"round{r:02d}"
        shutil.rmtree(rdir, ignore_errors=True)  # a round cut short starts again
        record: dict[str, Any] = {"round": r, "live_before": dict(self.data["live"])}
        reloaded = self.publisher.reconcile()  # a restarted vLLM lost the live versions
        if reloaded:
            log(f"round {r}: the server had lost {', '.join(reloaded)}: loaded again")
            record["reloaded"] = reloaded
        try:
            sources = self._collect(r, rdir, record)
            if sources is None:
                return False
            self._change(r, rdir, record, sources)
        finally:
            if self.prompts is not None:  # the round's span files read as text, once
                self.prompts.text.close()
        record["seconds"] = time.perf_counter() - t0
        record["live_after"] = dict(self.data["live"])
        for callback in self.callbacks:
            callback.on_round_end(self, rdir, record)
        self.data["rounds"].append(record)
        self.data["consumed"] += record.get("consumed", [])
        self.data["next_task"] = record.get("next_task", self.data["next_task"])
        self.state.save()
        log(f"round {r}: {record.get('transitions', 0)} transitions; live now "
            f"{self.data['live']}; round took {record['seconds']:.0f} s, "
            f"{self.state.elapsed / 60:.1f} min spent")
        return True

    def _change(self, r: int, rdir: Path, record: dict[str, Any], sources: list[Path]) -> None:
        """The round's watches, then at most one change: the prompts (an APO round) or the
        adapters (train, gate, publish); none while a version published last is not judged."""
        if self.prompts is not None:  # algorithm apo, apo+lora: the prompt versions' watch
            self.prompts.watch(r, rdir, record, sources)
        if self._unjudged() is not None:
            self._watch(record, self._transitions_for_watch(rdir, sources))
        if self._unjudged() is not None:  # one change at a time: judge the live one first
            held = self.data.setdefault("held_sources", [])
            held += [str(s) for s in sources]
            record["held"] = (f"the watch has not judged {version_key(self.data['live'])} "
                              f"yet: {record['watch']['reason']}")
            log(f"round {r}: no training, nothing published: {record['held']}")
            trained = None
        elif self.prompts is not None and self.prompts.holds(r, record, sources):
            trained = None  # a prompt version not judged yet: one change at a time
        elif self.prompts is not None and self.prompts.turn(r):
            self.prompts.round(r, rdir, record, sources)  # prompts change; adapters stay
            trained = None
        else:
            sources = [Path(s) for s in self.data.get("held_sources", [])] + sources
            for callback in self.callbacks:
                callback.on_train_begin(self)
            try:
                trained = self._train(r, rdir, sources, record)
            finally:
                for callback in self.callbacks:
                    callback.on_train_end(self)
            self.data.pop("held_sources", None)
        if trained is not None:
            self._watch(record, Path(trained["transitions_path"]))
            adapters = self._agent_adapters(trained["adapters"])
            chosen = self._gate(r, rdir, adapters, record)
            if chosen:
                self._publish(r, {a: adapters[a] for a in chosen}, record)
            self.data.pop("candidates_loaded", None)  # published, or unloaded when refused

    def _collect(self, r: int, rdir: Path, record: dict[str, Any]) -> list[Path] | None:
        cfg = self.cfg
        if cfg.team is not None:
            tasks = read_tasks(cfg.tasks or "")
            start = self.data["next_task"]
            chunk = tasks[start:start + cfg.tasks_per_round]
            if not chunk:
                log(f"round {r}: no training tasks left in {cfg.tasks}")
                return None
            log(f"round {r}: {len(chunk)} tasks x {cfg.rollouts} rollouts on "
                f"{self.data['live']} ...")
            with self.state.timed("rollouts (team + capture)"):
                run = self._team(cfg.team, chunk, rdir, rollouts=cfg.rollouts,
                                 temperature=cfg.temperature)
            record["team"] = run.summary
            record["next_task"] = start + len(chunk)
            return [run.spans]
        fresh = self._wait_for_traces(r, record)
        self._fresh = fresh or []  # the gate's inputs (gate.inputs)
        if fresh and cfg.replay_k:
            replayed = self._replay(r, rdir, fresh, record)
            return fresh + ([replayed] if replayed else [])
        return fresh

    def _replay(self, r: int, rdir: Path, files: list[Path], record: dict[str, Any]
                ) -> Path | None:
        """Live traffic never repeats, so its episodes are groups of one: play the inputs of
        the newest ``replay_inputs`` episodes again ``replay_k`` times each with the replay
        team (against the live versions), so each input becomes a group. The replays are
        rewarded as the team rewards them (inline, or a recipe)."""
        from agl_bridge.trainer.loop.replay import read_replay_spans, replay_inputs

        cfg = self.cfg
        inputs = replay_inputs(read_replay_spans(files, cfg.replay_field),
                               field_name=cfg.replay_field)
        tasks = inputs.tasks[-cfg.replay_inputs:]
        record["replay"] = {"inputs": len(tasks), "k": cfg.replay_k,
                            "without_input": len(inputs.without_input)}
        if not tasks:
            log(f"round {r}: nothing to replay ({len(inputs.without_input)} episode(s) "
                f"without an input)")
            return None
        command = cfg.replay_team or cfg.eval_team or cfg.team or ""
        log(f"round {r}: replaying {len(tasks)} input(s) x {cfg.replay_k} on "
            f"{self.data['live']} ...")
        with self.state.timed("replay"):
            run = self._team(command, tasks, rdir / "replay", rollouts=cfg.replay_k,
                             temperature=cfg.temperature)
        record["replay"]["team"] = run.summary
        return run.spans

    def _team(self, command: str, tasks: list[dict[str, Any]], out: Path, *, rollouts: int,
              temperature: float, aliases: dict[str, str] | None = None,
              prompts: Mapping[str, Mapping[str, str]] | None = None) -> TeamRun:
        """``aliases``: the versions to play (unset: the live ones); ``prompts``: a prompt
        table's entries other than the live one (a candidate's, in a gate). Both are written
        under ``out`` for the run."""
        env = {"AGL_BRIDGE_MAX_TOKENS": str(self.cfg.max_tokens)}
        table = self.registry / ALIASES_FILE
        if aliases is not None:
            table = out / ALIASES_FILE
            table.parent.mkdir(parents=True, exist_ok=True)
            table.write_text(json.dumps({"aliases": aliases}))
        if self.prompts is not None:  # the agents follow the prompt table
            env.update(self.prompts.env(out, prompts))
        return run_team(command, tasks, out, base_url=self.base_url, aliases=table,
                        rollouts=rollouts, temperature=temperature, service="team",
                        extra_env=env)

    def _wait_for_traces(self, r: int, record: dict[str, Any]) -> list[Path] | None:
        """Live: wait for span files the loop has not used, old enough for their feedback,
        until they hold ``min_episodes`` rewarded episodes or ``max_wait_s`` has passed."""
        from agl_bridge.parquet_io import iter_parquet_files

        cfg = self.cfg
        consumed = set(self.data["consumed"])
        t0 = time.monotonic()
        log(f"round {r}: waiting for {cfg.min_episodes} rewarded episodes in {cfg.traces} ...")
        judging: dict[str, Any] = {"tried": set(), "scored": 0, "failed": 0, "requests": 0,
                                   "seconds": 0.0}
        with self.state.timed("waiting for traces"):
            while True:
                now = time.time()
                fresh = [p for p in iter_parquet_files(cfg.traces or "")  # files: no FIFO
                         if str(p) not in consumed and p.is_file()
                         and now - p.stat().st_mtime >= cfg.settle_s]
                rewarded = self._rewarded_episodes(fresh) if fresh else set()
                if fresh and cfg.judge.rubric and self._judge(fresh, rewarded, judging):
                    rewarded = self._rewarded_episodes(fresh)
                episodes = len(rewarded)
                waited = time.monotonic() - t0
                if episodes >= cfg.min_episodes or (waited >= cfg.max_wait_s and episodes):
                    break
                if waited >= cfg.max_wait_s * 4 and not fresh:
                    log(f"round {r}: nothing new in {cfg.traces} for {waited:.0f} s; stopping")
                    return None
                time.sleep(min(5.0, max(0.5, cfg.settle_s / 4)))
        record["consumed"] = [str(p) for p in fresh]
        record["episodes_waited_for"] = episodes
        if cfg.judge.rubric:
            record["judge"] = {k: v for k, v in judging.items() if k != "tried"}
            log(f"round {r}: the judge scored {judging['scored']} episode(s) "
                f"({judging['failed']} failed) in {judging['seconds']:.0f} s"
                + (f"; first failure: {judging['first_failure']}"
                   if judging.get("first_failure") else ""))
        return fresh

    def _judge(self, files: list[Path], rewarded: set[str], judging: dict[str, Any]) -> int:
        """Let the LLM judge score the episodes of ``files`` that have no reward yet (feedback
        or inline rewards win: the judge scores the others), at most ``judge.max_episodes`` per
        round; an episode it failed on is not asked about again this round. Returns how many it
        scored."""
        import pyarrow.parquet as pq

        from agl_bridge.trainer.judging import judge_spans

        cfg, judge = self.cfg, self.cfg.judge
        budget = None if judge.max_episodes is None else \
            judge.max_episodes - judging["scored"] - judging["failed"]
        if (budget is not None and budget <= 0) or judge.rubric is None:
            return 0
        ids: set[str] = set()
        for path in files:
            try:
                column = pq.ParquetFile(path).read(columns=["episode_id"])["episode_id"]
            except (OSError, KeyError, ValueError):  # not a span file: nothing to judge there
                continue
            ids.update(e for e in column.to_pylist() if e)
        todo = ids - rewarded - judging["tried"]
        if not todo:
            return 0
        summary = judge_spans(cfg.traces or "", self._judge_settings(budget), episode_ids=todo,
                              progress=False)
        judging["tried"] |= set(summary.failed)  # scored ones are rewarded from now on
        if summary.failed and "first_failure" not in judging:  # the log says why, once
            episode, why = next(iter(summary.failed.items()))
            judging["first_failure"] = f"episode {episode}: {why}"
        judging["scored"] += summary.scored
        judging["failed"] += len(summary.failed)
        judging["requests"] += summary.requests
        judging["seconds"] += summary.seconds
        return summary.scored

    def _judge_settings(self, budget: int | None) -> Any:
        """The ``[judge]`` table, unset server and model meaning the loop's own (the base model
        judges), at most ``budget`` episodes."""
        judge = self.cfg.judge
        return dataclasses.replace(judge, base_url=judge.base_url or self.base_url,
                                   model=judge.model or BASE,
                                   tokenizer=judge.tokenizer or self.cfg.model,
                                   max_episodes=budget)

    def _rewarded_episodes(self, files: list[Path]) -> set[str]:
        """The rewarded episodes in ``files``, as conversion counts them; under ``apo`` calls
        without token ids count too (a hosted API's traces: APO reads their text)."""
        import pyarrow.parquet as pq

        from agl_bridge.trainer.conversion import convert

        probe = self.work / "probe" / "transitions.parquet"
        readable: Source = files
        if self.prompts is not None and self.cfg.algorithm == "apo":  # kept while unchanged
            readable, _ = self.prompts.text.of([str(f) for f in files])
        stats = convert(readable, probe, self.cfg.convert, evaluations_from=self.cfg.traces)
        return set(pq.read_table(probe, columns=["episode_id"])["episode_id"].to_pylist()) \
            if stats.transitions else set()

    def _train(self, r: int, rdir: Path, sources: list[Path], record: dict[str, Any]
               ) -> dict[str, Any] | None:
        from agl_bridge.trainer.training.from_traces import train_from_traces

        cfg = self.cfg
        init: dict[str, str | os.PathLike[str]] = {
            SHARED_ADAPTER if cfg.train.policy == "shared" else a: str(self._adapter_dir(a, v))
            for a, v in self.data["live"].items() if v != BASE}
        log(f"round {r}: training from {len(sources)} source(s) ...")
        with self.state.timed("convert + train"):
            try:
                run = train_from_traces(
                    [str(s) for s in sources], cfg.model, output_dir=rdir / "train",
                    adapters_dir=self.work / "adapters", init_adapters=init or None,
                    progress=sys.stderr.isatty(), evaluations_from=cfg.traces,
                    **values(cfg.convert), **{**values(cfg.train), "seed": cfg.train.seed + r,
                                              "train_agents": cfg.train.train_agents
                                              or cfg.agents})
            except NothingToTrain as exc:  # any other error is a fault: it stops the loop
                log(f"round {r}: nothing to train on ({str(exc).splitlines()[0]})")
                record["trained"] = False
                return None
        conv = run.conversion
        if conv is not None:
            from agl_bridge.trainer.rewards.evaluations import JOINED

            record["evaluations_joined"] = conv.notes.get(JOINED, 0)
            record["conversion"] = conv.summary(cfg.convert.algorithm)
        record.update({"trained": True, "adapters": {k: str(v) for k, v in run.adapters.items()},
                       "steps": run.steps, "metrics": str(run.metrics_path),
                       "transitions": conv.transitions if conv else None})
        if cfg.convert.algorithm != "ppo":  # ppo trains on its critic's advantages instead
            record.update({"zero_variance_groups": conv.zero_variance_groups if conv else None,
                           "baselines": dict(conv.baselines) if conv else {}})
        return {"adapters": record["adapters"], "transitions_path": str(run.transitions_path)}

    # -- evaluation, gate, publish, watch --------------------------------------------------
    def _scores(self, label: str, aliases: dict[str, str], out: Path, tasks_file: str, *,
                temperature: float, rollouts: int,
                prompts: Mapping[str, Mapping[str, str]] | None = None) -> Scores:
        """Scores of the versions ``aliases`` points at on ``tasks_file``, the team's and each
        role's (cached per version set, prompt versions, task file and decoding).
        ``prompts``: a candidate prompt table's entries (unset: the live table)."""
        cfg = self.cfg
        key = (f"{version_key(aliases)}{self.prompts.key(prompts) if self.prompts else ''} on "
               f"{Path(tasks_file).name} at temperature {temperature:g} x{rollouts}")
        if key in self.data["evals"] and label not in ("baseline", "final"):
            return Scores.from_dict(self.data["evals"][key])
        tasks = read_tasks(tasks_file)
        log(f"{label}: the team answers {len(tasks)} held-out tasks x {rollouts} at "
            f"temperature {temperature:g} on {aliases} ...")
        with self.state.timed("held-out evaluation"):
            run = self._team(cfg.eval_team or cfg.team or "", tasks, out, rollouts=rollouts,
                             temperature=temperature, aliases=aliases, prompts=prompts)
        scores = Scores(task_scores(run.results), role_scores(run.results))
        self.data["evals"][key] = scores.as_dict()
        self.state.save()
        return scores

    def _replayed_scores(self, r: int, aliases: dict[str, str], out: Path, *,
                         tasks: list[dict[str, Any]] | None = None,
                         prompts: Mapping[str, Mapping[str, str]] | None = None) -> Scores:
        """A live service's held-out check: the round's newest ``gate.inputs`` real inputs
        (or ``tasks``, inputs already chosen) played again on the versions ``aliases`` points
        at, under the live prompts or the table ``prompts``, as the service samples, scored per
        input by the team's own results, else by the episodes' rewards: the judge's verdicts
        (``[judge] rubric``), the recipe, inline (a role's by its own transitions')."""
        import pyarrow.parquet as pq

        from agl_bridge.trainer.conversion import convert
        from agl_bridge.trainer.judging import judge_spans
        from agl_bridge.trainer.loop.replay import read_replay_spans, replay_inputs

        cfg = self.cfg
        if tasks is None:
            tasks = replay_inputs(read_replay_spans(self._fresh, cfg.replay_field),
                                  field_name=cfg.replay_field).tasks[-cfg.gate.inputs:]
        log(f"round {r} gate: {len(tasks)} real input(s) replayed on {aliases}"
            f"{' with the candidate prompts' if prompts is not None else ''} ...")
        with self.state.timed("gate (replayed inputs)"):
            run = self._team(cfg.replay_team or cfg.eval_team or cfg.team or "", tasks, out,
                             rollouts=cfg.gate.rollouts, temperature=self._gate_temperature,
                             aliases=aliases, prompts=prompts)
            scores = task_scores(run.results)
            if scores or not run.spans.is_dir():
                return Scores(scores, role_scores(run.results))
            if cfg.judge.rubric is not None:
                judge_spans(run.spans, self._judge_settings(None), progress=False)
            convert(run.spans, out / "transitions.parquet", cfg.convert)
        team: dict[str, list[float]] = {}
        roles: dict[str, dict[str, list[float]]] = {}
        got = pq.read_table(out / "transitions.parquet",
                            columns=["task_id", "agent_name", "reward"])
        for task, agent, reward in zip(*(got[c].to_pylist() for c in got.column_names)):
            if task is not None and reward is not None:
                team.setdefault(task, []).append(reward)
                roles.setdefault(agent or "", {}).setdefault(task, []).append(reward)
        return Scores(mean_per_task(team), {a: mean_per_task(v) for a, v in roles.items()})

    @property
    def _gate_temperature(self) -> float:
        """As the team is served unless ``gate.temperature`` says otherwise."""
        t = self.cfg.gate.temperature
        return self.cfg.temperature if t is None else t

    def _evaluate(self, label: str) -> None:
        """The held-out evaluation of the live versions before the first round (``baseline``)
        and after the last (``final``)."""
        after = len(self.data["rounds"])
        if label in self.data and (label == "baseline" or
                                   self.data[label].get("after_rounds") == after):
            return
        if self.cfg.eval_tasks is None:
            self.data[label] = {"after_rounds": after, "policy": dict(self.data["live"])}
            return
        t0 = time.perf_counter()
        scores = self._scores(label, dict(self.data["live"]), self.work / label,
                              self.cfg.eval_tasks, temperature=self.cfg.eval_temperature,
                              rollouts=self.cfg.eval_rollouts).team
        n = len(scores)
        self.data[label] = {**self.data.get(label, {}), "policy": dict(self.data["live"]),
                            "after_rounds": after, "n": n, "seconds": time.perf_counter() - t0,
                            "score": math.fsum(scores.values()) / n if n else math.nan}
        for callback in self.callbacks:
            callback.on_evaluate(self, label, self.work / label)
        self.state.save()

    def _gate(self, r: int, rdir: Path, adapters: dict[str, str], record: dict[str, Any]
              ) -> list[str]:
        """The agents whose candidates go live (empty: refused), each candidate loaded and
        played beside the live versions on the gate's tasks."""
        from agl_bridge.trainer.serving.publisher import free_name, load_and_probe, served_name
        from agl_bridge.trainer.serving.validation import validate_adapter

        cfg = self.cfg
        candidate = dict(self.data["live"])
        for alias, directory in adapters.items():
            if alias not in candidate:
                continue  # an agent the loop was not told about: not served under an alias
            validate_adapter(directory, base_model=cfg.model,
                             max_lora_rank=cfg.serve.max_lora_rank)
            candidate[alias] = free_name([self.base_url], served_name(directory, alias),
                                         Path(directory))
            # recorded before it is loaded: a kill from here on leaves a name to unload
            self.data.setdefault("candidates_loaded", []).append(candidate[alias])
            self.state.save()
            load_and_probe([self.base_url], candidate[alias], Path(directory))
        record["candidate"] = candidate
        changed = [a for a, v in candidate.items() if v != self.data["live"].get(a)]
        chosen = self._decide(r, rdir, record, changed, candidate)
        refused = [a for a in changed if a not in chosen]
        if refused:
            self.data["events"].append({"round": r, "event": "refused",
                                        "candidate": {a: candidate[a] for a in refused},
                                        "reason": record["gate"]["rule"]})
            self._unload([candidate[a] for a in refused])
        return chosen

    def _decide(self, r: int, rdir: Path, record: dict[str, Any], changed: list[str],
                candidate: dict[str, str], prompts: Mapping[str, Mapping[str, str]] | None = None,
                inputs: list[dict[str, Any]] | None = None) -> list[str]:
        """The gate between the live versions and ``candidate`` (adapter versions; a prompt
        round's candidate is the table ``prompts`` on the live adapters), on a live service's
        real inputs replayed (``[gate] inputs``; ``inputs``: those already chosen) or on its
        held-out tasks: the ``changed`` agents it lets go live (all when it is off), its
        decision in ``record["gate"]``."""
        gate = self.cfg.gate
        tasks = gate.tasks or self.cfg.eval_tasks
        if gate.rule == "off" or (tasks is None and not gate.inputs):
            record["gate"] = {"publish": True, "rule": "gate off"}
            return changed
        what = "" if prompts is None else " prompts"
        arms = (("live", dict(self.data["live"]), None), ("candidate", candidate, prompts))
        live, cand = (
            self._replayed_scores(r, versions, rdir / f"gate-{label}", tasks=inputs,
                                  prompts=entries) if gate.inputs else
            self._scores(f"round {r} gate: {label}{what}", versions, rdir / f"gate-{label}",
                         tasks or "", temperature=self._gate_temperature,
                         rollouts=gate.rollouts, prompts=entries)
            for label, versions, entries in arms)
        verdict = decide(live, cand, changed, rule=gate.rule, tolerance=gate.tolerance,
                         partial=gate.partial)
        record["gate"] = verdict.record(temperature=self._gate_temperature,
                                        rollouts=gate.rollouts)
        log(f"round {r} gate{what and ' (prompts)'}: {verdict.headline}: "
            f"{record['gate']['rule']}" + "".join(
                f"; {a}: {d.difference:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
                for a, d in verdict.roles.items()))
        return verdict.published

    def _unload(self, names: list[str]) -> None:
        from agl_bridge.trainer.serving.publisher import _post, _root

        for name in names:
            _post(f"{_root(self.base_url)}/v1/unload_lora_adapter", {"lora_name": name}, 60.0)

    def _publish(self, r: int, adapters: dict[str, str], record: dict[str, Any]) -> None:
        with self.state.timed("publish"):
            published = {a: self.publisher.publish(d, alias=a) for a, d in adapters.items()
                         if a in self.data["live"]}
        previous = dict(self.data["live"])
        self.data["live"].update(published)
        record["published"] = published
        self.data["events"].append({"round": r, "event": "published", "versions": published,
                                    "previous": previous, "time": time.time()})

    def _unjudged(self) -> dict[str, Any] | None:
        """The last publish event while its versions are live and the watch has not judged
        them yet (kept or rolled back)."""
        published = [e for e in self.data["events"] if e["event"] == "published"]
        if not published or published[-1].get("watched"):
            return None
        last = published[-1]
        live = version_key({**last["previous"], **last["versions"]})
        return last if live == version_key(self.data["live"]) else None

    def _transitions_for_watch(self, rdir: Path, sources: list[Path]) -> Path:
        """The round's episodes as transitions, rewarded as training would reward them, for a
        watch that runs before (or instead of) training."""
        from agl_bridge.trainer.conversion import convert

        out = rdir / "watch" / "transitions.parquet"
        convert(sources, out, self.cfg.convert, evaluations_from=self.cfg.traces)
        return out

    def _watch(self, record: dict[str, Any], transitions: Path) -> None:
        """This round's episodes' rewards by the versions that served them (each episode
        once, however many rounds read it); the version published last is judged against the
        best recent one, and rolled back if worse."""
        cfg = self.cfg
        seen = self.data.setdefault("watched_episodes", [])
        known = set(seen)
        if transitions.is_file():
            for episode, (key, reward) in episode_versions(transitions).items():
                if episode in known:
                    continue
                seen.append(episode)
                kept = self.data["rewards"].setdefault(key, [])
                kept.append(reward)
                del kept[:-RECENT]
            del seen[:-RECENT * 8]
        last = self._unjudged()
        if last is None:
            return
        current_key = version_key({**last["previous"], **last["versions"]})
        published = [e for e in self.data["events"] if e["event"] == "published"]
        recent = [e["previous"] for e in published[-cfg.watch.window:]]  # live before each
        rewards = self.data["rewards"]
        target = recent[best_recent([(version_key(s), rewards.get(version_key(s), []))
                                     for s in recent])]
        decision = watch(rewards.get(version_key(target), []), rewards.get(current_key, []),
                         margin=cfg.watch.margin, min_episodes=cfg.watch.episodes)
        record["watch"] = {**decision.as_dict(), "against": target}
        if decision.verdict == "wait":
            return
        last["watched"] = decision.verdict
        if decision.verdict == "rollback":
            log(f"watch: rolling back {last['versions']} -> {target}: {decision.reason}")
            with self.state.timed("publish"):
                for alias, name in target.items():
                    if name == BASE:
                        from agl_bridge.aliases import AliasTable

                        table = AliasTable(self.registry / ALIASES_FILE)
                        table.write({**table.read().get("aliases", {}), alias: BASE})
                    else:
                        self.publisher.rollback(alias, name)
            self.data["live"].update(target)
            self.data["events"].append({"round": record["round"], "event": "rolled back",
                                        "from": last["versions"], "to": target,
                                        "reason": decision.reason, "time": time.time()})
            record["rolled_back"] = True


def _exclusive(path: Path, what: str) -> int:
    """An exclusive ``flock`` on ``path``, held while this process lives: two loops on one
    workdir or registry each took the other's state for their own. The kernel drops the lock
    of a killed holder, so a ``kill -9`` never leaves it behind."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ValueError(f"another loop runs on {what} (pid {holder}): one loop per workdir and "
                         f"per registry; stop it, or give this one its own") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
