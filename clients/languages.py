"""Which target language a text most likely wants, from the languages the server says a model translates.

`attnserve translate` without `--to` asks the server for the model's languages (GetModel) and sends the
text to the other language, chosen as the server itself chooses for a request without a target language
(protos/attnserve/api/language_detection.py, which both ends share): so the CLI can print the choice, and an older
server that did not choose gets the same answer. "" = leave the choice to the server.
"""

from __future__ import annotations

from attnserve.api.generation import ModelInfo
from attnserve.api.language_detection import language_scripts, other_language, script_of

__all__ = ["default_target", "language_scripts", "script_of"]


def default_target(info: ModelInfo, text: str) -> str:
    """The target language for `text` on the model `info` describes; "" = let the server choose."""
    return other_language(info.source_languages, info.target_languages, text)
