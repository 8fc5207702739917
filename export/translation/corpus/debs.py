"""Fetch Debian packages with ``apt-get download`` and unpack them with ``dpkg-deb -x``.

Nothing is ever installed.  Both steps are cached: a ``.deb`` already in the cache
directory is not downloaded again, and an unpacked tree carries a stamp file naming
the ``.deb`` it came from, so a rebuild only redoes work for packages that changed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


class DebCache:
    """Download/unpack cache rooted at ``debs_dir`` (the .deb files) and ``unpack_dir``."""

    def __init__(self, debs_dir: Path, unpack_dir: Path):
        self.debs_dir = debs_dir
        self.unpack_dir = unpack_dir
        self.used: dict[str, str] = {}  # package -> .deb file name, recorded in stats.json

    def deb_path(self, package: str) -> Path:
        """Return the cached .deb for ``package``, downloading it on first use."""
        found = self._cached(package)
        if found is None:
            self.debs_dir.mkdir(parents=True, exist_ok=True)
            # APT drops to the _apt user for downloads; as root that user may not be able to
            # write into our cache dir, so let it download as the invoking user.
            subprocess.run(
                ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", package],
                cwd=self.debs_dir, check=True, stdout=subprocess.DEVNULL,
            )
            found = self._cached(package)
            if found is None:
                raise FileNotFoundError(f"apt-get download {package} produced no .deb")
        self.used[package] = found.name
        return found

    def _cached(self, package: str) -> Path | None:
        # Debian file names are ``name_version_arch.deb``; the underscore keeps ``git``
        # from matching ``git-man``.  Newest file name wins when several versions are cached.
        hits = sorted(self.debs_dir.glob(f"{package}_*.deb"))
        return hits[-1] if hits else None

    def root(self, package: str) -> Path:
        """Return the directory holding the unpacked contents of ``package``."""
        deb = self.deb_path(package)
        target = self.unpack_dir / package
        stamp = target / ".unpacked-from"
        if stamp.is_file() and stamp.read_text() == deb.name:
            return target
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], check=True)
        stamp.write_text(deb.name)
        return target
