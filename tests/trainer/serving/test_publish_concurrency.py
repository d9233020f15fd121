"""Publishing under concurrency and faults (issue 14, item 11): publishers in separate
processes share one registry through its lock, so none loses another's history, an alias only
goes back a version by an explicit rollback, and a publisher killed while holding the lock does
not block the next one. The server is the scripted one with vLLM's adapter endpoints."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from agl_bridge.aliases import AliasTable
from agl_bridge.trainer.serving.publisher import Publisher, PublishError
from tests.lora_files import write_adapter
from tests.paths import ROOT, TESTS
from tests.scripted_server import ScriptedServer

WORKER = TESTS / "publish_worker.py"
VERSIONS = 10  # per alias; each of the 4 workers publishes 5 of them
# one worker per (alias, half): odd versions oldest first, even newest first, so that
# publishes of versions older than the live one happen in every run
PLAN = [("a", [1, 3, 5, 7, 9]), ("a", [10, 8, 6, 4, 2]),
        ("b", [9, 7, 5, 3, 1]), ("b", [2, 4, 6, 8, 10])]


def adapters(root: Path, alias: str, versions: list[int]) -> list[Path]:
    return [write_adapter(root / alias / f"v{v:04d}") for v in versions]


def start_worker(registry: Path, server: ScriptedServer, alias: str, go: Path,
                 dirs: list[Path], *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(WORKER), str(registry), server.base_url,
                             alias, str(go), *map(str, dirs), *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
    return proc


def history(registry: Path) -> dict[str, list[dict]]:
    return json.loads((registry / "history.json").read_text())


def aliases(registry: Path) -> dict[str, str]:
    return json.loads((registry / "aliases.json").read_text())["aliases"]


@pytest.mark.parametrize("run", range(3))
def test_four_processes_publishing_two_aliases_lose_nothing(tmp_path, run):
    registry, go = tmp_path / "registry", tmp_path / "go"
    with ScriptedServer(lora=True, load_delay_s=0.01) as server:
        workers = [start_worker(registry, server, alias, go, adapters(tmp_path / "ad", alias, vs))
                   for alias, vs in PLAN]
        go.touch()  # all four start publishing at once
        outputs = [w.communicate(timeout=300) for w in workers]
        assert [w.returncode for w in workers] == [0] * 4, [err for _, err in outputs]
        published = Counter(line for out, _ in outputs for line in out.split())
        assert published == Counter(f"{a}@v{v}" for a in "ab" for v in range(1, VERSIONS + 1))

        hist = history(registry)
        for alias in "ab":
            names = [v["name"] for v in hist[alias]]
            # every version of both aliases, exactly once
            assert sorted(names, key=lambda n: int(n.split("@v")[1])) == \
                [f"{alias}@v{v}" for v in range(1, VERSIONS + 1)]
            # versions go live in version order, whoever finished first
            assert aliases(registry)[alias] == f"{alias}@v{VERSIONS}"
            assert [v["name"] for v in hist[alias] if v["state"] == "live"] == \
                [f"{alias}@v{VERSIONS}"]
        # the history agrees with the server: the live versions are loaded, and nothing the
        # history calls unloaded still is
        states = {v["name"]: v["state"] for vs in hist.values() for v in vs}
        assert {f"a@v{VERSIONS}", f"b@v{VERSIONS}"} <= set(server.adapters)
        assert not {n for n, s in states.items() if s == "unloaded"} & set(server.adapters)

        # both aliases roll back, from a fresh publisher as the command line would
        publisher = Publisher([server.base_url], registry, drain_s=0.0)
        assert publisher.rollback("b", "v5") == "b@v5"
        assert publisher.rollback("a", 3) == "a@v3"
        assert aliases(registry) == {"a": "a@v3", "b": "b@v5"}
        assert {"a@v3", "b@v5"} <= set(server.adapters)


def test_a_publisher_holding_an_old_view_keeps_the_others_entries(tmp_path):
    """Two publishers created before either published: each change is made to the files as
    they are now, not to the history a publisher read when it was created."""
    registry = tmp_path / "registry"
    with ScriptedServer(lora=True) as server:
        first = Publisher([server.base_url], registry, drain_s=3600)
        second = Publisher([server.base_url], registry, drain_s=3600)
        first.publish(write_adapter(tmp_path / "ad" / "a" / "v0001"), alias="a")
        second.publish(write_adapter(tmp_path / "ad" / "b" / "v0001"), alias="b")
        first.publish(write_adapter(tmp_path / "ad" / "a" / "v0002"), alias="a")
        assert {a: [v["name"] for v in vs] for a, vs in history(registry).items()} == \
            {"a": ["a@v1", "a@v2"], "b": ["b@v1"]}
        assert second.rollback("a", "v1") == "a@v1"
        assert aliases(registry) == {"a": "a@v1", "b": "b@v1"}


def test_an_older_version_is_recorded_but_does_not_move_the_alias_back(tmp_path):
    registry = tmp_path / "registry"
    with ScriptedServer(lora=True) as server:
        publisher = Publisher([server.base_url], registry, drain_s=3600)
        v1, v2, v3 = (write_adapter(tmp_path / "ad" / "a" / f"v000{i}") for i in (1, 2, 3))
        publisher.publish(v2, alias="a")
        assert publisher.publish(v1, alias="a") == "a@v1"  # loaded and probed...
        assert publisher.live("a") == "a@v2"  # ...but the alias stays on the newer one
        assert {v["name"]: v["state"] for v in history(registry)["a"]} == \
            {"a@v2": "live", "a@v1": "retired"}
        assert publisher.rollback("a", "v1") == "a@v1"  # going back is explicit
        assert publisher.live("a") == "a@v1"
        publisher.publish(v3, alias="a")  # forward from the rolled-back version
        assert publisher.live("a") == "a@v3"


def test_the_same_name_from_another_directory_is_refused(tmp_path):
    """A server keeps the weights it loaded first under a name ("already loaded"), so a second
    directory published under that name would be served with the first one's weights."""
    registry = tmp_path / "registry"
    with ScriptedServer(lora=True) as server:
        publisher = Publisher([server.base_url], registry)
        publisher.publish(write_adapter(tmp_path / "x" / "team" / "v0001"), alias="team")
        with pytest.raises(PublishError, match=r"team@v1 was published from .*x/team/v0001"):
            publisher.publish(write_adapter(tmp_path / "y" / "team" / "v0001"), alias="team")
        assert {k: str(Path(v).resolve()) for k, v in server.adapters.items()} == {
            "team@v1": str(tmp_path / "x" / "team" / "v0001")}


def test_a_server_down_during_publish_is_a_publish_error_and_changes_no_alias(tmp_path):
    registry = tmp_path / "registry"
    with ScriptedServer(lora=True) as server:
        down = ScriptedServer(lora=True)  # bound, never started: connections are refused
        down.httpd.server_close()
        publisher = Publisher([server.base_url, down.base_url], registry, timeout_s=5)
        with pytest.raises(PublishError, match=f"{down.base_url[:-3]} did not take adapter "
                                               f"a@v1"):
            publisher.publish(write_adapter(tmp_path / "ad" / "a" / "v0001"), alias="a")
        assert publisher.live("a") is None
        # recorded as retired, so a collection unloads what reached the server that was up
        assert [(v["name"], v["state"]) for v in history(registry)["a"]] == \
            [("a@v1", "retired")]
        assert Publisher([server.base_url], registry, drain_s=0).collect() == ["a@v1"]
        assert server.adapters == {}


def test_a_publisher_killed_holding_the_lock_does_not_block_the_next(tmp_path):
    registry, go = tmp_path / "registry", tmp_path / "go"
    go.touch()
    with ScriptedServer(lora=True) as server:
        victim = start_worker(registry, server, "a",  go,
                              adapters(tmp_path / "ad", "a", [1]), "--block-in-commit")
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == "in-commit"  # inside the alias switch
        fd = os.open(registry / ".registry.lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # the victim holds the registry's lock
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=60)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the kernel released it
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        assert victim.returncode == -signal.SIGKILL

        # the next publisher, in a process of its own (a deadlock would time out there)
        nxt = start_worker(registry, server, "a", go, adapters(tmp_path / "ad", "a", [2]))
        out, err = nxt.communicate(timeout=120)
        assert nxt.returncode == 0 and out.split() == ["a@v2"], err
        assert aliases(registry) == {"a": "a@v2"}
        # the killed publish left its version recorded as loading, alias untouched; once
        # stale, a collection unloads it and a rollback can still bring it back
        assert {v["name"]: v["state"] for v in history(registry)["a"]} == \
            {"a@v1": "loading", "a@v2": "live"}
        assert "a@v1" in server.adapters
        publisher = Publisher([server.base_url], registry, drain_s=0, stale_loading_s=0)
        assert publisher.collect() == ["a@v1"] and "a@v1" not in server.adapters
        assert publisher.rollback("a", "v1") == "a@v1" and "a@v1" in server.adapters


def test_a_kill_between_the_alias_switch_and_the_history_write_heals(tmp_path):
    """The alias table is written first: killed right after it, the history still calls the
    previous version live and the new one loading. The next change to the registry makes the
    history agree with the alias table, so a collection unloads the old version, not the one
    the agents now use."""
    registry = tmp_path / "registry"
    with ScriptedServer(lora=True) as server:
        publisher = Publisher([server.base_url], registry, drain_s=0, stale_loading_s=0)
        publisher.publish(write_adapter(tmp_path / "ad" / "a" / "v0001"), alias="a")
        v2 = write_adapter(tmp_path / "ad" / "a" / "v0002")
        # the state such a kill leaves: v2 recorded as loading and loaded, the alias on it
        hist = history(registry)
        hist["a"].append({"name": "a@v2", "directory": str(v2), "published_unix": 0.0,
                          "state": "loading", "pinned_unix": 0.0})
        (registry / "history.json").write_text(json.dumps(hist))
        server.adapters["a@v2"] = str(v2)
        AliasTable(registry / "aliases.json").write({"a": "a@v2"})

        assert publisher.collect() == ["a@v1"]
        assert {v["name"]: v["state"] for v in history(registry)["a"]} == \
            {"a@v1": "unloaded", "a@v2": "live"}
        assert set(server.adapters) == {"a@v2"}


def test_the_command_line_says_when_an_alias_stays_on_a_newer_version(tmp_path, capsys):
    from agl_bridge.cli import main

    registry = tmp_path / "registry"
    v1, v2 = (write_adapter(tmp_path / "ad" / "team" / f"v000{i}") for i in (1, 2))
    with ScriptedServer(lora=True) as server:
        run = lambda *a: main([*a, "--registry", str(registry), "--server", server.base_url])  # noqa: E731
        assert run("publish", str(v2), "--alias", "team") == 0
        assert run("publish", str(v1), "--alias", "team") == 0
        out = capsys.readouterr().out.splitlines()
        assert out[1] == (f"published {v1} as team@v1; alias team stays on the newer team@v2 "
                          f"(agl-bridge rollback team team@v1 makes team@v1 live)")
        assert main(["rollback", "team", "v1", "--registry", str(registry),
                     "--server", server.base_url]) == 0
        assert capsys.readouterr().out.strip() == "alias team -> team@v1"


def test_a_version_is_marked_unloaded_only_once_every_server_let_it_go(tmp_path):
    """A server that is down (the collector cannot tell what is busy) or that fails the
    unload request: the retired version stays retired, and goes at a later collection."""
    registry = tmp_path / "registry"
    with ScriptedServer(lora=True) as server:
        up = Publisher([server.base_url], registry, drain_s=3600)
        up.publish(write_adapter(tmp_path / "ad" / "a" / "v0001"), alias="a")
        up.publish(write_adapter(tmp_path / "ad" / "a" / "v0002"), alias="a")
        down = ScriptedServer(lora=True)
        down.httpd.server_close()
        assert Publisher([server.base_url, down.base_url], registry, drain_s=0).collect() == []
        server.unload_status = 500
        assert Publisher([server.base_url], registry, drain_s=0).collect() == []
        assert {v["name"]: v["state"] for v in history(registry)["a"]} == \
            {"a@v1": "retired", "a@v2": "live"}
        assert "a@v1" in server.adapters
        server.unload_status = 200
        assert Publisher([server.base_url], registry, drain_s=0).collect() == ["a@v1"]
        assert set(server.adapters) == {"a@v2"}


def test_another_registry_on_the_same_server_gets_a_name_of_its_own(tmp_path):
    """Issue 30.3: "already loaded" counted as success, so a second registry (or run)
    publishing `team@v1` from another directory exited 0 while the server kept the first one's
    weights. Now a name the server holds with other weights is not reused: the version is
    served as `team@v1-<digest>`, each registry's agents get their own weights, and a rollback
    by number finds it. Loading under a name held with other weights is `NameTaken`."""
    from agl_bridge.trainer.serving.errors import NameTaken
    from agl_bridge.trainer.serving.publisher import adapter_digest, load_and_probe

    with ScriptedServer(lora=True) as server:
        first = write_adapter(tmp_path / "x" / "team" / "v0001")
        Publisher([server.base_url], tmp_path / "reg-a").publish(first, alias="team")
        theirs = write_adapter(tmp_path / "y" / "team" / "v0001",
                               config_overrides={"lora_alpha": 7})
        with pytest.raises(NameTaken, match=r"already serves team@v1 from .*x/team/.loaded/"
                                            r"v0001-[0-9a-f]{16}, not .*y/team/v0001.*Unload "
                                            r"it there"):
            load_and_probe([server.base_url], "team@v1", theirs)
        other = Publisher([server.base_url], tmp_path / "reg-b")
        own = f"team@v1-{adapter_digest(theirs)[:8]}"
        assert other.publish(theirs, alias="team") == own
        assert AliasTable(tmp_path / "reg-b" / "aliases.json").read()["aliases"] == {
            "team": own}
        assert AliasTable(tmp_path / "reg-a" / "aliases.json").read()["aliases"] == {
            "team": "team@v1"}
        assert {k: Path(v).resolve() for k, v in server.adapters.items()} == {
            "team@v1": first, own: theirs}
        assert other.rollback("team", "v1") == own  # by number: the history knows its name
        # the same directory from another registry is the same adapter: taken as it is; so is
        # a copy of it elsewhere (the same content digest)
        assert Publisher([server.base_url], tmp_path / "reg-c").publish(first, alias="team") \
            == "team@v1"
        copy = write_adapter(tmp_path / "z" / "team" / "v0001")
        assert Publisher([server.base_url], tmp_path / "reg-d").publish(copy, alias="team") == \
            "team@v1"
        assert server.loads == 2


def test_a_directory_written_again_in_place_replaces_its_old_weights_on_the_server(tmp_path):
    """Issue 30.3: `loop --fresh` against a running server trains ``v0001`` again at the same
    path; the server answered "already loaded" and kept the first run's weights. The server
    loads from a link named for the content, so the old copy is known for what it is, unloaded
    and replaced."""
    import shutil

    directory = tmp_path / "work" / "adapters" / "team" / "v0001"
    with ScriptedServer(lora=True) as server:
        Publisher([server.base_url], tmp_path / "work" / "registry").publish(
            write_adapter(directory), alias="team")
        first = server.adapters["team@v1"]
        shutil.rmtree(tmp_path / "work")  # --fresh
        write_adapter(directory, config_overrides={"lora_alpha": 7})  # the new run's v0001
        assert Publisher([server.base_url], tmp_path / "work" / "registry").publish(
            directory, alias="team") == "team@v1"
        now = server.adapters["team@v1"]
        assert now != first and Path(now).resolve() == directory and server.loads == 2
        unloads = [b["lora_name"] for b in server.requests
                   if "lora_name" in b and "lora_path" not in b]
        assert unloads == ["team@v1"]


def test_a_restarted_server_gets_the_live_versions_again(tmp_path):
    """Issue 30.2: after vLLM restarts, every call to the live versions answered 404 until
    someone published again; ``reconcile`` (run by the loop each round, by `agl-bridge serve` at
    start, and by publish and rollback) loads them again, and nothing else."""
    registry = tmp_path / "registry"
    with ScriptedServer(lora=True) as server:
        publisher = Publisher([server.base_url], registry, drain_s=0.0)
        for v in (1, 2):
            publisher.publish(write_adapter(tmp_path / "team" / f"v{v:04d}"), alias="team")
        publisher.publish(write_adapter(tmp_path / "coder" / "v0001"), alias="coder")
        publisher.collect()
        assert set(server.adapters) == {"team@v2", "coder@v1"}
        assert publisher.reconcile() == []  # nothing lost: nothing loaded
        server.adapters.clear()  # the restart
        assert sorted(publisher.reconcile()) == [f"{n} on {server.base_url.removesuffix('/v1')}"
                                                 for n in ("coder@v1", "team@v2")]
        assert set(server.adapters) == {"team@v2", "coder@v1"}  # not the retired team@v1
