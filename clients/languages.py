"""Which target language a text most likely wants, from the languages the server says a model translates.

`attnserve translate` without `--to` asks the server for the model's languages (GetModel) and sends the
text to the other language: a model with one target language gets that one; otherwise the text's writing
system picks its source language among the model's (mixed text counts as its non-Latin script: Chinese UI
text often holds English names), and the target is the first target language that is not it. When the
script cannot tell (two Latin-script languages), the CLI leaves the choice to the server's default.
"""

from __future__ import annotations

import collections
import unicodedata

from attnserve.server.generation import ModelInfo

# Language (the subtag before any "-") -> the scripts its text is written in; unlisted languages: Latin.
SCRIPTS = {
    "zh": {"Han"},
    "ja": {"Kana", "Han"},
    "ko": {"Hangul", "Han"},
    "ru": {"Cyrillic"},
    "uk": {"Cyrillic"},
    "bg": {"Cyrillic"},
    "sr": {"Cyrillic"},
    "el": {"Greek"},
    "ar": {"Arabic"},
    "fa": {"Arabic"},
    "ur": {"Arabic"},
    "he": {"Hebrew"},
    "th": {"Thai"},
    "hi": {"Devanagari"},
    "mr": {"Devanagari"},
}
# Unicode character name prefix -> script.
_NAME_PREFIXES = {
    "CJK": "Han",
    "HIRAGANA": "Kana",
    "KATAKANA": "Kana",
    "HANGUL": "Hangul",
    "CYRILLIC": "Cyrillic",
    "GREEK": "Greek",
    "ARABIC": "Arabic",
    "HEBREW": "Hebrew",
    "THAI": "Thai",
    "DEVANAGARI": "Devanagari",
    "LATIN": "Latin",
}


def script_of(text: str) -> str | None:
    """The text's script: its most frequent non-Latin script if it has one, else Latin; None without letters."""
    counts = collections.Counter(s for s in map(_char_script, text) if s is not None)
    if not counts:
        return None
    # Kana marks Japanese even where Han characters outnumber it.
    if "Kana" in counts:
        return "Kana"
    others = [(n, s) for s, n in counts.items() if s != "Latin"]
    return max(others)[1] if others else "Latin"


def _char_script(ch: str) -> str | None:
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    return next((script for prefix, script in _NAME_PREFIXES.items() if name.startswith(prefix)), None)


def language_scripts(language: str) -> set[str]:
    return SCRIPTS.get(language.split("-")[0].lower(), {"Latin"})


def default_target(info: ModelInfo, text: str) -> str:
    """The target language for `text` on the model `info` describes; "" = let the server choose.

    Returns:
        The only target language; or the first one that is not the text's language, guessed among the
        model's source languages by script; or "" when the script matches none or every target language.
    """
    targets = info.target_languages
    if len(targets) == 1:
        return targets[0]
    script = script_of(text)
    sources = [lang for lang in info.source_languages if script in language_scripts(lang)]
    others = [lang for lang in targets if lang not in sources]
    if not sources or not others or len({s.split("-")[0] for s in sources}) > 1:
        return ""
    return others[0]
