"""Every input kind's preprocessor, by the manifest's `input.kind`: the one place that knows them all.

The base class and the text preprocessor are server/preprocessing.py's; each other kind's module builds on
it (server/audio.py, server/image.py, server/video.py), so picking one lives here, above all of them, and no module imports
another from inside a function.
"""

from __future__ import annotations

from attnserve.server.audio import AudioPreprocessor
from attnserve.server.image import ImagePreprocessor
from attnserve.server.manifest import Manifest
from attnserve.server.preprocessing import Preprocessor, TextPreprocessor
from attnserve.server.tokenization import Tokenizer
from attnserve.server.video import VideoPreprocessor

KINDS: dict[str, type[Preprocessor]] = {
    cls.kind.value: cls for cls in (TextPreprocessor, AudioPreprocessor, ImagePreprocessor, VideoPreprocessor)
}


def create(manifest: Manifest, tokenizer: Tokenizer | None) -> Preprocessor:
    """The preprocessor of the model's input kind."""
    return KINDS[manifest.input.kind](manifest, tokenizer)
