"""What zero-code capture does at start-up, without loading what it defers: post-import hooks
(``otel.import_hooks``), the instrumentor table against the wheel's entry points, and context
into threads (``otel.thread_context``)."""

import concurrent.futures
import contextvars
import importlib
import importlib.resources
import subprocess
import sys
import threading

import pytest
import tomllib

from agl_bridge.otel import auto, thread_context
from agl_bridge.otel.import_hooks import when_imported
from tests.paths import ROOT


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh top-level package with a data file, importable once."""
    def make(name):
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text("VALUE = 41\n")
        (pkg / "data.txt").write_text("hello")
        monkeypatch.syspath_prepend(str(tmp_path))
        return name
    yield make


def test_a_hook_runs_once_after_the_module_has_executed(package):
    name = package("agl_hooked_pkg")
    seen = []
    when_imported(name, lambda m: seen.append(m.VALUE))
    assert seen == []
    mod = importlib.import_module(name)
    importlib.reload(mod)
    assert seen == [41]
    # the module keeps its own loader: resources read as without the hook
    assert importlib.resources.files(name).joinpath("data.txt").read_text() == "hello"
    assert type(mod.__spec__.loader).__name__ != "_HookedLoader"


def test_a_module_already_imported_gets_its_hook_now():
    seen = []
    when_imported("json", lambda m: seen.append(m.__name__))
    assert seen == ["json"]


def test_a_failing_hook_is_reported_and_the_import_still_succeeds(package, capsys):
    name = package("agl_broken_hook_pkg")
    when_imported(name, lambda m: 1 / 0)
    assert importlib.import_module(name).VALUE == 41
    assert f"post-import hook for {name} failed: ZeroDivisionError" in capsys.readouterr().err


def test_only_top_level_modules_are_watched():
    with pytest.raises(ValueError, match="top-level"):
        when_imported("openai.types", lambda m: None)


def test_the_instrumentor_table_is_the_wheels_entry_points():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = {name: target for name, target in
                meta["project"]["entry-points"][auto.ENTRY_POINT_GROUP].items()
                if name.startswith(auto.ENTRY_POINT_PREFIX)}
    assert {n: t for n, (t, _) in auto.INSTRUMENTORS.items()} == declared
    for name, (target, module) in auto.INSTRUMENTORS.items():
        cls = auto._load(target)
        assert getattr(cls, "hook_module", None) == module, name


def test_start_up_loads_neither_instrumentors_nor_wrapt_nor_entry_point_metadata(tmp_path):
    code = ("import sys; from agl_bridge.otel import auto; assert auto.activate() is not None; "
            "print(sorted(m for m in ('wrapt', 'asyncio', 'importlib.metadata', 'openai', "
            "'opentelemetry.instrumentation.instrumentor', 'agl_bridge.integrations.openai') "
            "if m in sys.modules)); print(auto.instrumented)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "AGL_BRIDGE_PARQUET_DIR": str(tmp_path)},
                         cwd=tmp_path, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "['agl_bridge_threads']"], out.stderr


def test_context_follows_threads_and_pools_and_uninstall_restores():
    var = contextvars.ContextVar("v", default="unset")
    before = (threading.Thread.start, threading.Thread.run,
              concurrent.futures.ThreadPoolExecutor.submit)
    was = thread_context.installed()
    thread_context.install()
    thread_context.install()  # idempotent
    try:
        var.set("set")
        seen = []
        t = threading.Thread(target=lambda: seen.append(var.get()))
        t.start()
        t.join()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            seen.append(pool.submit(var.get).result())
        assert seen == ["set", "set"]
    finally:
        if not was:
            thread_context.uninstall()
            thread_context.uninstall()
    if not was:
        assert (threading.Thread.start, threading.Thread.run,
                concurrent.futures.ThreadPoolExecutor.submit) == before


@pytest.mark.parametrize("preset", [None, "1"])
def test_start_up_sets_arrows_allocator_option_before_pyarrow_loads_unless_the_user_did(
        tmp_path, preset):
    """mimalloc reads its options once, when pyarrow loads: the variable must be in the
    environment by then, and a value the user set wins."""
    code = ("import os, sys; from agl_bridge.otel import auto; auto.activate(); "
            "print('pyarrow' in sys.modules, os.environ.get('MIMALLOC_ARENA_EAGER_COMMIT'))")
    env = {"PATH": "/usr/bin:/bin", "AGL_BRIDGE_PARQUET_DIR": str(tmp_path)}
    if preset is not None:
        env["MIMALLOC_ARENA_EAGER_COMMIT"] = preset
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=tmp_path, check=True)
    assert out.stdout.split() == ["False", preset or "0"], out.stderr
    # and with pyarrow loaded first (too late to matter), the environment is left alone
    late = subprocess.run([sys.executable, "-c", "import pyarrow; " + code], capture_output=True,
                          text=True, env=env, cwd=tmp_path, check=True)
    assert late.stdout.split() == ["True", str(preset)], late.stderr
