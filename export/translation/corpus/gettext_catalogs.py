"""Translated UI strings from gettext ``.mo`` catalogs shipped in Debian packages.

For each package, every ``.mo`` file under a ``zh_TW`` locale directory is read
with :class:`gettext.GNUTranslations`; its msgids are the English source strings.
Catalog keys come in three shapes: ``"msgid"``, ``"context\\x04msgid"`` and, for
plural entries, ``("msgid", n)``.  Chinese has a single plural form, so only form 0
is kept and paired with the singular msgid.  calibre ships its catalogs in a zip.
"""

from __future__ import annotations

import gettext
import io
import zipfile
from pathlib import Path
from typing import Iterable, Iterator

from . import Pair

PACKAGES = (
    "blender-data", "inkscape", "calibre", "gimp-data", "evolution-common", "git",
    "gnucash-common", "darktable", "audacity-data", "gnumeric-common", "digikam-data",
    "gcc-12-locales", "libc-l10n", "vim-runtime", "kdenlive-data", "libreoffice-l10n-zh-tw",
)
CALIBRE_ZIP = "usr/share/calibre/localization/locales.zip"
# Credits entries whose "translation" is a list of translator names, not a translation.
_CREDIT_IDS = {
    "translator-credits", "translator_credits", "Your names", "Your emails",
    "NAME OF TRANSLATORS", "EMAIL OF TRANSLATORS", "translator-name",
}


def _is_zh_tw(path: Path) -> bool:
    # vim ships both zh_TW (Big5) and zh_TW.UTF-8; GNUTranslations decodes either
    # and the duplicates disappear in deduplication.
    return any(part.split(".")[0] == "zh_TW" for part in path.parts)


def catalog_pairs(data: bytes) -> Iterator[tuple[str, str]]:
    """Yield (English msgid, zh msgstr) from the bytes of one .mo file."""
    catalog = gettext.GNUTranslations(io.BytesIO(data))._catalog
    for key, msgstr in catalog.items():
        if isinstance(key, tuple):
            msgid, form = key
            if form != 0:
                continue
        else:
            msgid = key
        msgid = msgid.rsplit("\x04", 1)[-1]  # drop msgctxt
        if msgid and msgstr and msgid not in _CREDIT_IDS:
            yield msgid, msgstr


def _mo_blobs(package: str, root: Path) -> Iterable[tuple[str, bytes]]:
    if package == "calibre":
        with zipfile.ZipFile(root / CALIBRE_ZIP) as archive:
            for name in sorted(archive.namelist()):
                if name.startswith("zh_TW/") and name.endswith(".mo"):
                    yield name, archive.read(name)
        return
    for path in zh_tw_catalogs(root):
        yield str(path.relative_to(root)), path.read_bytes()


def zh_tw_catalogs(root: Path) -> Iterator[Path]:
    """Every ``.mo`` file under a ``zh_TW`` locale directory of an unpacked package, in path order."""
    for path in sorted(root.rglob("*.mo")):
        if _is_zh_tw(path.relative_to(root)):
            yield path


def extract(debs, packages: Iterable[str] = PACKAGES) -> Iterator[Pair]:
    for package in packages:
        for name, blob in _mo_blobs(package, debs.root(package)):
            try:
                pairs = list(catalog_pairs(blob))
            except (OSError, ValueError, UnicodeDecodeError) as error:
                print(f"  skipping unreadable catalog {package}:{name}: {error}")
                continue
            for en, zh in pairs:
                yield Pair(en, zh, f"gettext/{package}")
