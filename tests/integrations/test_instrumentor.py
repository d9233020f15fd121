"""``Instrumentor``: uninstrument takes off exactly the wrappers instrument put on."""

import types

from agl_bridge.integrations.instrumentor import Instrumentor


class _Target:
    def method(self):
        return "original"


def _function():
    return "original"


_module = types.ModuleType("agl_bridge_test_target")
_module.Target = _Target
_module.function = _function


def _wrapper(wrapped, instance, args, kwargs):
    return "wrapped " + wrapped(*args, **kwargs)


class _Demo(Instrumentor):
    requires = ("demo >= 1",)

    def _instrument(self, **kwargs):
        self.wrap(_module, "Target.method", _wrapper)
        self.wrap(_module, "function", _wrapper)


def test_wrappers_go_on_and_come_off_again():
    demo = _Demo()
    assert demo.instrumentation_dependencies() == ("demo >= 1",)
    demo.instrument(skip_dep_check=True)
    try:
        assert _Target().method() == "wrapped original"
        assert _module.function() == "wrapped original"
    finally:
        demo.uninstrument()
    assert _Target().method() == "original"
    assert _module.function() == "original"
    assert _Target.__dict__["method"] is _Target.method  # the plain function is back
