"""The alias table read by agents on every call: a file of the wrong shape, a damaged or missing
file, never fails the agent's own ``create()``; it is reported once and the last good table (or
no routing) is kept. Issue 14, item 9."""

import json
import logging
import os

import openai
import pytest

from agl_bridge import semconv as sc
from agl_bridge.aliases import ALIASES_ENV, AliasTable
from tests.scripted_server import ScriptedServer

MESSAGES = [{"role": "user", "content": "hi"}]

HOSTILE = {
    "a list": (b"[]", "the top level is a list"),
    "null": (b"null", "the top level is null"),
    "aliases null": (b'{"aliases": null}', '"aliases" is null'),
    "aliases a list": (b'{"aliases": [1, 2]}', '"aliases" is a list'),
    "a number as target": (b'{"aliases": {"team": 5}}', "'team' -> 5"),
    "an empty target": (b'{"aliases": {"team": ""}}', "'team' -> ''"),
    "no aliases key": (b'{"team": "team@v1"}', 'no "aliases" key'),
    "not JSON": (b"\xff\x00{{ not json", "not valid JSON"),
}


def write(path, content: bytes) -> None:
    """As a publisher (or an editor, or a broken disk) would: a new file renamed into place."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def good(**aliases: str) -> bytes:
    return json.dumps({"aliases": aliases}).encode()


def warnings_about(caplog, path):
    return [r.getMessage() for r in caplog.records
            if r.name == "agl_bridge.aliases" and r.levelno == logging.WARNING
            and str(path) in r.getMessage()]


def ask(client, n=1):
    for _ in range(n):
        response = client.chat.completions.create(model="team", messages=MESSAGES)
        assert response.choices[0].message.content == "hello"  # the agent's call succeeded


@pytest.mark.parametrize("content, what", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_alias_file_never_fails_the_agents_call(
        content, what, tmp_path, monkeypatch, caplog, spans, instrumented):
    path = tmp_path / "aliases.json"
    write(path, content)
    monkeypatch.setenv(ALIASES_ENV, str(path))
    with ScriptedServer(vllm=False) as server:
        ask(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0), n=3)
    # no good table ever: the name is sent as the agent wrote it, never 5 or ""
    assert [b["model"] for b in server.requests] == ["team"] * 3
    (warning,) = warnings_about(caplog, path)  # once, not once per call
    assert what in warning and "no alias is routed" in warning


@pytest.mark.parametrize("garbage", ["a list", "a number as target", "not JSON"])
def test_a_table_replaced_mid_run_by_garbage_keeps_the_last_good_one(
        garbage, tmp_path, monkeypatch, caplog, spans, instrumented):
    path = tmp_path / "aliases.json"
    write(path, good(team="team@v1"))
    monkeypatch.setenv(ALIASES_ENV, str(path))
    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        ask(client)
        write(path, HOSTILE[garbage][0])
        ask(client, n=2)
        write(path, good(team="team@v2"))  # fixed: the new table is taken at once
        ask(client)
    assert [b["model"] for b in server.requests] == ["team@v1"] * 3 + ["team@v2"]
    (warning,) = warnings_about(caplog, path)
    assert HOSTILE[garbage][1] in warning and "keeping the table read before" in warning
    chats = [s for s in spans.get_finished_spans() if s.name.startswith("chat")]
    assert [s.attributes.get(sc.POLICY_ALIAS) for s in chats] == ["team"] * 4


def test_a_missing_file_routes_nothing_until_it_appears_and_a_deleted_one_keeps_its_table(
        tmp_path, monkeypatch, caplog, spans, instrumented):
    path = tmp_path / "registry" / "aliases.json"
    monkeypatch.setenv(ALIASES_ENV, str(path))
    with ScriptedServer(vllm=False) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        ask(client, n=2)
        path.parent.mkdir()
        write(path, good(team="team@v3"))
        ask(client)
        path.unlink()  # e.g. a tool that deletes before it writes
        ask(client)
    assert [b["model"] for b in server.requests] == ["team", "team", "team@v3", "team@v3"]
    first, second = warnings_about(caplog, path)
    assert "does not exist" in first and "no alias is routed" in first
    assert "does not exist" in second and "keeping the table read before (1 aliases)" in second


def test_write_refuses_a_table_agents_would_refuse(tmp_path):
    from agl_bridge.aliases import AliasFileError

    table = AliasTable(tmp_path / "aliases.json")
    with pytest.raises(AliasFileError, match="'team' -> 5"):
        table.write({"team": 5})
    assert not table.path.exists()
    table.write({"team": "team@v1"})
    assert table.resolve("team") == "team@v1" and table.resolve("other") is None
    assert table.resolve(5) is None  # not a name: nothing to route, and no error
