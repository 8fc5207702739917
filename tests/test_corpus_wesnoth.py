"""Wesnoth's story catalogs: which catalogs are read, which strings become pairs, and how evaluation files
them (a domain of their own, so that adding them leaves the software scores comparable)."""

import struct

from attnserve.export.translation import evaluate
from attnserve.export.translation.corpus import wesnoth


def mo_file(entries: dict) -> bytes:
    """A GNU .mo catalog: keys are msgids (plural entries as "singular\\0plural"), values their msgstr."""
    keys = sorted(entries)
    ids = [k.encode() for k in keys]
    strs = [entries[k].encode() for k in keys]
    header = 7 * 4
    ids_table, strs_table = header, header + 8 * len(keys)
    data_start = strs_table + 8 * len(keys)
    offsets, blob = [], b""
    for text in ids + strs:
        offsets.append((len(text), data_start + len(blob)))
        blob += text + b"\0"
    out = struct.pack("<7I", 0x950412DE, 0, len(keys), ids_table, strs_table, 0, 0)
    out += b"".join(struct.pack("<2I", n, at) for n, at in offsets)
    return out + blob


HEADER = "Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=1; plural=0;\n"


class FakeDebs:
    def __init__(self, roots):
        self.roots = roots

    def root(self, package):
        return self.roots[package]


def test_story_catalogs_become_pairs_and_ui_catalogs_locales_and_markup_stay_out(tmp_path):
    def catalog(package, locale, name, entries):
        folder = tmp_path / package / "usr/share/games/wesnoth/1.16/locale" / locale / "LC_MESSAGES"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.mo").write_bytes(mo_file({"": HEADER, **entries}))

    catalog("wesnoth-1.16-httt", "zh_TW", "wesnoth-httt", {
        "We must hurry to the castle!": "我們必須趕往城堡！",
        "Well done, $unit.name|!": "做得好，$unit.name|！",
        "<italic>text='Castles'</italic> are forts.": "<italic>text='城堡'</italic>是要塞。",
        "I see one enemy.\0I see $n enemies.": "我看見敵人。",
        "Untranslated line": "",
    })
    catalog("wesnoth-1.16-httt", "zh_CN", "wesnoth-httt", {"We must hurry to the castle!": "我们必须赶往城堡！"})
    catalog("wesnoth-1.16-data", "zh_TW", "wesnoth-lib", {"Overwrite?": "覆蓋？"})
    catalog("wesnoth-1.16-data", "zh_TW", "wesnoth-units", {"A stout dwarf.": "一個結實的矮人。"})
    roots = {package: tmp_path / package for package in wesnoth.PACKAGES}
    pairs = sorted(wesnoth.extract(FakeDebs(roots)))
    assert pairs == [
        ("A stout dwarf.", "一個結實的矮人。", "wesnoth/wesnoth-units"),
        ("I see one enemy.", "我看見敵人。", "wesnoth/wesnoth-httt"),
        ("We must hurry to the castle!", "我們必須趕往城堡！", "wesnoth/wesnoth-httt"),
    ]
    assert pairs[0].family == "wesnoth"


def test_markup_and_variables_are_recognised_and_plain_punctuation_is_not():
    for text in ("Well done, $unit.name!", "<b>Bold</b>", "{prefix}", "[scenario]", "text=x", "&image.png"):
        assert wesnoth.has_markup(text), text
    for text in ("Fools, my death here means nothing!", "Wait... (whispers) 'Is that you?' - yes; 100%"):
        assert not wesnoth.has_markup(text), text


def test_story_pairs_are_scored_apart_from_software_text():
    families = ["hsk", "gettext", "wesnoth", "cedict", "tatoeba", "libreoffice_help", "wesnoth"]
    assert evaluate.domain_rows(families) == {
        "everyday": [0, 4], "dictionary": [3], "story": [2, 6], "software": [1, 5]}
