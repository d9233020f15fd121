"""The alias table over HTTP: the publisher's host serves the registry's table, agents on
other hosts poll it (``AGL_BRIDGE_ALIASES=http://...``)."""

import json
import logging
import socket
import struct
import time
import urllib.error
import urllib.request

import pytest

from agl_bridge import aliases
from agl_bridge.aliases import HttpAliasTable
from agl_bridge.trainer.serving.alias_server import AliasServer


def _write(registry, table, raw=None):
    registry.mkdir(parents=True, exist_ok=True)
    tmp = registry / ".aliases.tmp"
    tmp.write_text(raw if raw is not None else json.dumps({"aliases": table}))
    tmp.replace(registry / "aliases.json")


def _wait(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_served_table_switches_for_pollers_and_answers_304_when_unchanged(tmp_path):
    registry = tmp_path / "registry"
    _write(registry, {"coder": "coder@v1"})
    with AliasServer(registry) as server:
        with urllib.request.urlopen(server.url) as r:
            etag, body = r.headers["ETag"], json.loads(r.read())
        assert body["aliases"] == {"coder": "coder@v1"}
        req = urllib.request.Request(server.url, headers={"If-None-Match": etag})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req)
        assert info.value.code == 304
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(server.url.replace("/aliases", "/other"))
        assert info.value.code == 404

        table = HttpAliasTable(server.url, poll_s=0.05)
        try:
            assert table.resolve("coder") == "coder@v1"  # the first call waits for the poll
            assert table.resolve("other") is None and table.resolve(3) is None  # type: ignore
            _write(registry, {"coder": "coder@v2"})
            _wait(lambda: table.resolve("coder") == "coder@v2")
        finally:
            table.close()


def test_unusable_or_unreachable_keeps_the_last_good_table_and_warns_once(tmp_path, caplog):
    registry = tmp_path / "registry"
    _write(registry, {"coder": "coder@v1"})
    server = AliasServer(registry).start()
    table = HttpAliasTable(server.url, poll_s=3600)  # polled by hand below
    try:
        assert table.resolve("coder") == "coder@v1"
        with caplog.at_level(logging.WARNING, logger="agl_bridge.aliases"):
            _write(registry, None, raw='{"aliases": {"coder": 7}}')
            table.poll()
            table.poll()
            _write(registry, None, raw="not json")
            table.poll()
            server.close()
            table.poll()
            table.poll()
        assert table.resolve("coder") == "coder@v1"  # kept through all of it
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 3, warnings  # once per kind of failure
        assert "only non-empty strings" in warnings[0] and "not valid JSON" in warnings[1]
        assert "cannot be reached" in warnings[2] and "keeping the table" in warnings[2]
    finally:
        table.close()


def test_a_process_never_polled_routes_nothing_and_an_agent_call_does_not_wait(
        tmp_path, monkeypatch):
    """Unreachable from the start: nothing routes; once the first poll is over, a call reads
    the last table and never touches the network (no timing asserted: the network is
    patched to fail the test if a call reaches it)."""
    table = HttpAliasTable("http://127.0.0.1:9/aliases", poll_s=3600, timeout_s=0.5)
    try:
        assert table.resolve("coder") is None
        assert table._fetched.is_set()  # the first poll is over (failed)

        def no_network(*a, **k):
            raise AssertionError("resolve() reached the network")

        monkeypatch.setattr(urllib.request, "urlopen", no_network)
        assert table.resolve("coder") is None and table.resolve("other") is None
    finally:
        table.close()


def test_the_environment_chooses_file_or_url(tmp_path, monkeypatch):
    monkeypatch.setenv(aliases.ALIASES_ENV, "http://127.0.0.1:9/aliases")
    monkeypatch.setenv(aliases.POLL_ENV, "nan")
    table = aliases.default_table()
    try:
        assert isinstance(table, HttpAliasTable) and table.poll_s == aliases.DEFAULT_POLL_S
        assert aliases.default_table() is table  # one poller per process
        monkeypatch.setenv(aliases.ALIASES_ENV, str(tmp_path / "aliases.json"))
        assert isinstance(aliases.default_table(), aliases.AliasTable)
        assert table._stop.is_set()  # the replaced poller stopped
        monkeypatch.setenv(aliases.ALIASES_ENV, "http://127.0.0.1:9/aliases")
        polling = aliases.default_table()
        monkeypatch.delenv(aliases.ALIASES_ENV)
        assert aliases.default_table() is None
        assert isinstance(polling, HttpAliasTable) and polling._stop.is_set()  # unset: stopped
    finally:
        table.close()
    with pytest.raises(ValueError, match="positive"):
        HttpAliasTable("http://x/aliases", poll_s=0)


def test_a_dropped_connection_is_tried_again_at_once_and_not_reported(tmp_path, caplog):
    """A loaded server or network drops the odd connection (CI saw a reset, then a failed
    connect): the poll tries once more at once instead of waiting a whole interval with the
    old table, and a blip that passed is not a warning. Two in a row are."""
    registry = tmp_path / "registry"
    _write(registry, {"coder": "coder@v1"})
    resets = []  # the server resets the connections it is told to, like a peer gone away

    with AliasServer(registry) as server:
        handle = server.httpd.finish_request

        def finish_request(request, client_address):
            if resets and resets.pop():
                request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                   struct.pack("ii", 1, 0))  # close with RST, unanswered
                return
            handle(request, client_address)

        server.httpd.finish_request = finish_request
        table = HttpAliasTable(server.url, poll_s=3600)  # polled by hand below
        try:
            assert table.resolve("coder") == "coder@v1"
            _write(registry, {"coder": "coder@v2"})
            with caplog.at_level(logging.WARNING, logger="agl_bridge.aliases"):
                resets[:] = [True]
                table.poll()
                assert resets == [] and table.resolve("coder") == "coder@v2"
                assert caplog.records == []
                _write(registry, {"coder": "coder@v3"})
                resets[:] = [True, True]
                table.poll()
                assert resets == [] and table.resolve("coder") == "coder@v2"  # kept
            assert len(caplog.records) == 1
            assert "cannot be reached (" in caplog.records[0].getMessage()  # reset or disconnected
            table.poll()
            assert table.resolve("coder") == "coder@v3"
        finally:
            table.close()
