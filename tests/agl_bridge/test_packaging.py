import subprocess
import sys

from tests.paths import ROOT


def test_capture_path_never_imports_torch():
    code = ("import sys, agl_bridge, agl_bridge.otel, agl_bridge.integrations.openai, "
            "agl_bridge.trainer.conversion, agl_bridge.trainer.rewards.advantages, "
            "agl_bridge.trainer.adapters, agl_bridge.trainer.serving.publisher, "
            "agl_bridge.trainer.training.report, agl_bridge.trainer.training.config, "
            "agl_bridge.trainer.training, agl_bridge.cli; "
            "bad = [m for m in ('torch', 'transformers', 'peft', 'vllm') if m in sys.modules]; "
            "print(bad); assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_subpackages_live_under_one_import_name():
    import agl_bridge.integrations.openai as oi
    import agl_bridge.otel as otel
    import agl_bridge.trainer.conversion as tr

    assert otel.__name__ == "agl_bridge.otel" and oi.__name__.startswith("agl_bridge.")
    assert tr.__name__ == "agl_bridge.trainer.conversion"


def test_semconv_is_the_only_place_attribute_names_are_spelled():
    """No module but semconv.py writes an agl_bridge.* or gen_ai.* attribute literal."""
    import re

    pattern = re.compile(r"""["'](gen_ai\.[a-z_.]+|agl_bridge\.[a-z_]+\.[a-z_.]+)["']""")
    offenders = []
    for folder in ("agl_bridge", "otel", "integrations", "trainer"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "semconv.py":
                continue
            offenders += [f"{path.relative_to(ROOT)}: {m}" for m in
                          pattern.findall(path.read_text()) if not _is_module(m)]
    assert offenders == []


def _is_module(name: str) -> bool:
    """Our own module paths (lazy imports) are not attribute names."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_every_instrumentor_has_an_entry_point():
    """AGL_BRIDGE_AUTO and opentelemetry-instrument find instrumentors only by entry point."""
    import importlib
    import inspect
    import pkgutil
    from importlib.metadata import entry_points

    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

    import agl_bridge.integrations
    import agl_bridge.otel

    found = set()  # every module, packages' modules too (integrations/openai/ is a package)
    for package in (agl_bridge.integrations, agl_bridge.otel):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            found |= {f"{module.__name__}:{name}" for name, obj in vars(module).items()
                      if inspect.isclass(obj) and issubclass(obj, BaseInstrumentor)
                      and obj is not BaseInstrumentor and obj.__module__ == module.__name__
                      and "_instrument" in vars(obj)}  # not the shared base
    registered = {ep.value for ep in entry_points(group="opentelemetry_instrumentor")
                  if ep.name.startswith("agl_bridge_")}
    assert found and found == registered
