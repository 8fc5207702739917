"""Where the Debian packages of recorded speech are on this machine, for the tests that read the real ones."""

from __future__ import annotations

import os
import pathlib


def package_root(package: str, marker: str) -> pathlib.Path | None:
    """The root under which `package` is unpacked ($ATTNSERVE_REAL_SPEECH_PKG/<package>, as
    export/speech/real.py leaves it) or installed (/), found by its file `marker`; None if neither."""
    unpacked = os.environ.get("ATTNSERVE_REAL_SPEECH_PKG")
    for root in ([pathlib.Path(unpacked) / package] if unpacked else []) + [pathlib.Path("/")]:
        if (root / marker).exists():
            return root
    return None
