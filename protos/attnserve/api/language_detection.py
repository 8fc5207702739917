"""Which language a text is written in, and so which target language a request without one wants.

A request to a translator may leave `target_language` empty. The text's writing system then picks its
source language among the model's (mixed text counts as its non-Latin script: Chinese UI text often holds
English names), and the target is the first target language that is not it: 知識 -> en, "knowledge" ->
zh-TW on translate-zh-en. A model with one target language gets that one. When the script cannot tell
(no letters, a script none of the model's languages is written in, or two source languages sharing it,
such as two Latin-script ones), the model's first target language is used, as for audio and images.

Shared by the server (server/engine/engine.py) and the clients (clients/languages.py asks the same question with
a ModelInfo), so both ends choose alike; it imports nothing but the standard library.
"""

from __future__ import annotations

import collections
import unicodedata
from collections.abc import Sequence

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


def other_language(source_languages: Sequence[str], target_languages: Sequence[str], text: str) -> str:
    """The target language for `text`; "" when the script cannot tell (the caller's default applies).

    Returns:
        The only target language; or the first one that is not the text's language, guessed among the
        source languages by script; or "" when the script matches none, several, or every target language.
    """
    if len(target_languages) == 1:
        return target_languages[0]
    script = script_of(text)
    sources = [lang for lang in source_languages if script in language_scripts(lang)]
    others = [lang for lang in target_languages if lang not in sources]
    if not sources or not others or len({s.split("-")[0] for s in sources}) > 1:
        return ""
    return others[0]


def target_for(source_languages: Sequence[str], target_languages: Sequence[str], text: str) -> str:
    """What the server uses for a request without a target language: `other_language`, else the first."""
    return other_language(source_languages, target_languages, text) or target_languages[0]
