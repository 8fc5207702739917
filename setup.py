"""Generates the gRPC stubs while the package is built (all metadata is in pyproject.toml)."""

import pathlib
import runpy

from setuptools import setup
from setuptools.command.build_py import build_py

_ROOT = pathlib.Path(__file__).resolve().parent
_GENERATE = _ROOT / "protos" / "generate.py"
# Import name -> folder, as in pyproject.toml's [tool.setuptools.package-dir].
_PACKAGE_ROOTS = {"attnserve.server": "server", "attnserve.clients": "clients", "attnserve.export": "export",
                  "attnserve.v1": "protos/attnserve/v1", "attnserve.api": "protos/attnserve/api"}


# Folders of data only (no __init__.py), named as packages so that setuptools ships their files as package
# data without warning that they are missing from `packages`.
_DATA_PACKAGES = ["attnserve.clients.web.static"]


def _packages() -> list[str]:
    """Every folder with an __init__.py under the package roots, by import name, and the data folders."""
    found = list(_DATA_PACKAGES)
    for name, folder in _PACKAGE_ROOTS.items():
        for init in sorted((_ROOT / folder).rglob("__init__.py")):
            found.append(".".join((name, *init.parent.relative_to(_ROOT / folder).parts)))
    return found


class BuildPyWithStubs(build_py):
    """build_py that also runs protos/generate.py.

    A wheel gets the stubs written into its build directory, never into the source tree. An editable
    install imports `attnserve.v1` from protos/attnserve/v1/ itself, so there they go next to the .proto.
    """

    def run(self):
        super().run()
        generate = runpy.run_path(str(_GENERATE))["generate"]
        generate() if self.editable_mode else generate(self.build_lib)


setup(packages=_packages(), cmdclass={"build_py": BuildPyWithStubs})
