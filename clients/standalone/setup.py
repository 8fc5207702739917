"""Builds attnserve-client, the client distribution (its metadata is in pyproject.toml).

The wheel holds what `attnserve.clients` imports and nothing of the serving core: every module of clients/
(not clients/web/, the browser demo's gateway, which needs aiohttp and stays with the server), the
contract both ends share (`attnserve.api`: the request/result dataclasses, their protobuf conversion, the
choice of a target language), and the `attnserve.v1` stubs, generated here from the .proto as the
server's build does.

The files are the checkout's own, copied at build time, so the client cannot drift from the server. They
install to the same paths as in the server's wheel: with both distributions installed (same version), the
shared files are the same bytes. There is no `attnserve/__init__.py` in either wheel (`attnserve` is a
namespace package), and the script is `attnserve-client`, so nothing else overlaps.

An sdist carries copies of the files under `sources/`, so a wheel builds from the sdist too.
"""

import pathlib
import runpy

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

_HERE = pathlib.Path(__file__).resolve().parent
# The checkout (two folders up), or the copies an sdist carries.
_SOURCES = _HERE / "sources" if (_HERE / "sources").is_dir() else _HERE.parents[1]




def _modules() -> dict[str, str]:
    """Path in the wheel -> path in the checkout, for every file the wheel holds but the generated stubs."""
    clients = {f"attnserve/clients/{p.name}": f"clients/{p.name}" for p in sorted((_SOURCES / "clients").glob("*.py"))}
    shared = {f"attnserve/api/{p.name}": f"protos/attnserve/api/{p.name}"
              for p in sorted((_SOURCES / "protos/attnserve/api").glob("*.py"))}
    stubs = {f"attnserve/v1/{name}": f"protos/attnserve/v1/{name}" for name in ("__init__.py", "attnserve.proto")}
    return clients | shared | stubs


# What the build reads beyond the wheel's files: the stub generator.
_BUILD_ONLY = ["protos/generate.py"]


class BuildClient(build_py):
    """Copies the listed files into the build directory and writes the stubs beside them."""

    def run(self):
        for wheel_path, source in _modules().items():
            target = pathlib.Path(self.build_lib, wheel_path)
            self.mkpath(str(target.parent))
            self.copy_file(str(_SOURCES / source), str(target))
        runpy.run_path(str(_SOURCES / "protos" / "generate.py"))["generate"](self.build_lib)

    def get_source_files(self):
        return []  # the sdist gets its sources from SdistWithSources, not from package folders

    def get_outputs(self, include_bytecode=True):
        return [str(p) for p in pathlib.Path(self.build_lib, "attnserve").rglob("*") if p.is_file()]


class SdistWithSources(sdist):
    """sdist that also carries the checkout's files the wheel is built from, under sources/."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        for source in [*_modules().values(), *_BUILD_ONLY]:
            target = pathlib.Path(base_dir, "sources", source)
            self.mkpath(str(target.parent))
            self.copy_file(str(_SOURCES / source), str(target))


setup(
    # Declared so that setuptools runs build_py; BuildClient decides what goes in.
    packages=["attnserve.clients", "attnserve.api", "attnserve.v1"],
    cmdclass={"build_py": BuildClient, "sdist": SdistWithSources},
)
