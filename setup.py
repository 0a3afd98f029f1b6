"""Build step that ships ``sb3_ppo_ext_zoo_hook.pth`` at the root of site-packages (all other metadata: pyproject.toml).

setuptools has no declarative way to install a ``.pth`` file. ``build_py`` copies it into the
build root, which becomes the root of the wheel (``pip install .``); in an editable install
(``pip install -e .``) setuptools' ``editable_wheel`` points ``install_lib`` at the unpacked
editable wheel, so the file is copied there too. Either way pip puts it in site-packages next to
``sb3_ppo_ext_zoo_hook.py``, and ``site`` runs its one guarded line at interpreter start.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_FILE = "sb3_ppo_ext_zoo_hook.pth"


class BuildPyWithPth(build_py):
    """``build_py`` that also puts the startup-hook ``.pth`` file at the root of the wheel."""

    def run(self) -> None:
        super().run()
        source = os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH_FILE)
        targets = [self.build_lib]
        if getattr(self, "editable_mode", False):
            install_lib = getattr(self.distribution.get_command_obj("install"), "install_lib", None)
            if install_lib:
                targets.append(install_lib)
        for target in targets:
            self.mkpath(target)
            self.copy_file(source, os.path.join(target, PTH_FILE), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH_FILE)]


setup(cmdclass={"build_py": BuildPyWithPth})
