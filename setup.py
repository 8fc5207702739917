"""Generates the gRPC stubs before the package's modules are collected (all metadata is in pyproject.toml)."""

import runpy

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithStubs(build_py):
    def run(self):
        runpy.run_path("protos/generate.py")["generate"]()
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
