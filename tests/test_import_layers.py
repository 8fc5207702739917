"""The layer rule: pyproject.toml's import-linter contracts hold, and the linter really sees the arrows.

The folders are installed under other names (server/ as attnserve.server: pyproject.toml's package-dir),
which hides every import from tools that walk the folders; grimp asks the import system instead. The
second test shows it does: a contract that the code breaks must be reported broken.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports", path=str(pathlib.Path(sys.executable).parent))

pytestmark = pytest.mark.skipif(LINT is None, reason="import-linter is in the dev extra")


def lint(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([LINT, "--no-cache", "--no-logo", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_the_layer_contracts_hold():
    run = lint()
    assert run.returncode == 0, run.stdout + run.stderr
    analyzed = int(re.search(r"Analyzed (\d+) files", run.stdout).group(1))
    assert analyzed > 150  # every module of server/, clients/, export/ and the stubs, not an empty graph
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"{len(contracts)} kept, 0 broken" in run.stdout


def test_a_contract_the_code_breaks_is_reported_with_its_chain(tmp_path):
    # The engine imports the batcher: forbidding it must fail, naming the import line.
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\n"
        "root_packages =\n    attnserve.server\n"
        "[importlinter:contract:probe]\n"
        "name = probe\n"
        "type = forbidden\n"
        "source_modules =\n    attnserve.server.engine.engine\n"
        "forbidden_modules =\n    attnserve.server.engine.batcher\n"
    )
    run = lint(cwd=tmp_path)
    assert run.returncode == 1 and "attnserve.server.engine.engine -> attnserve.server.engine.batcher" in run.stdout, run.stdout


def test_a_shared_layer_that_imports_a_family_is_reported(tmp_path):
    # The translators import common/: with common/ put above translation/, a layers contract must fail on
    # those arrows, naming them (the real contract has common/ at the bottom).
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\n"
        "root_packages =\n    attnserve.export\n"
        "[importlinter:contract:probe]\n"
        "name = probe\n"
        "type = layers\n"
        "layers =\n    attnserve.export.common\n    attnserve.export.translation\n"
    )
    run = lint(cwd=tmp_path)
    assert run.returncode == 1, run.stdout
    said = re.sub(r"\s+", " ", run.stdout)  # the report wraps long lines
    assert "attnserve.export.translation is not allowed to import attnserve.export.common" in said, run.stdout
    assert re.search(r"attnserve\.export\.translation\.\w+ -> attnserve\.export\.common\.\w+ \(l\.\d+\)", said), run.stdout
