"""Only here to ship the start-up hook ``agl_bridge_auto.pth`` at the top of site-packages
(everything else is in pyproject.toml). Python executes a ``.pth`` line that starts with
``import`` at start-up; ours activates capture when ``AGL_BRIDGE_AUTO`` is set."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "agl_bridge_auto.pth"


class BuildPyWithStartupHook(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithStartupHook})
