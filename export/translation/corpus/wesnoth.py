"""Story text from Battle for Wesnoth: its zh_TW gettext catalogs, from Debian's packages of the game's data
and its official campaigns (GPL-2+).

Unlike the applications' UI strings, most of these are whole sentences that characters say to each other
("Perhaps the monsters Lord Kalenz alluded to sunk the boats.") and unit descriptions in plain prose: the
nearest thing to everyday narrative text that Debian ships with a Traditional Chinese translation. Two
catalogs are UI strings and stay out (`wesnoth-lib`, `wesnoth-editor`). A string that carries the game's
markup or variables (`<italic>…</italic>`, `$unit.name`, `{prefix}`, `[scenario]`, `text=`, `&image.png`)
is skipped: removing them would leave sentences with holes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from . import Pair
from .gettext_catalogs import catalog_pairs, zh_tw_catalogs

CAMPAIGNS = ("did", "dm", "dw", "ei", "httt", "l", "low", "nr", "sof", "sota", "sotbe", "thot", "trow", "tsg",
             "ttb", "utbs")
PACKAGES = ("wesnoth-1.16-data", *(f"wesnoth-1.16-{name}" for name in CAMPAIGNS))
UI_CATALOGS = ("wesnoth-lib", "wesnoth-editor")
_MARKUP = re.compile(r"[<>$@{}\[\]=&]")


def has_markup(text: str) -> bool:
    """The game's markup, variables or references, which a translation pair should not carry."""
    return bool(_MARKUP.search(text))


def catalogs(root: Path) -> Iterator[Path]:
    """The zh_TW story catalogs under an unpacked package."""
    return (path for path in zh_tw_catalogs(root) if path.stem not in UI_CATALOGS)


def extract(debs) -> Iterator[Pair]:
    for package in PACKAGES:
        for path in catalogs(debs.root(package)):
            for en, zh in catalog_pairs(path.read_bytes()):
                if not has_markup(en) and not has_markup(zh):
                    yield Pair(en, zh, f"wesnoth/{path.stem}")
