"""Every input kind's preprocessor, by the manifest's `input.kind`: the one place that knows them all.

The base class and the text preprocessor are server/inputs/preprocessing.py's; each other kind's module builds on
it (server/inputs/audio.py, server/inputs/image.py, server/inputs/video.py), so picking one lives here, above all of them, and no module imports
another from inside a function.
"""

from __future__ import annotations

from attnserve.server.inputs.audio import AudioPreprocessor
from attnserve.server.inputs.image import ImagePreprocessor
from attnserve.server.model.manifest import Manifest
from attnserve.server.inputs.preprocessing import Preprocessor, TextPreprocessor
from attnserve.server.model.tokenization import Tokenizer
from attnserve.server.inputs.video import VideoPreprocessor

KINDS: dict[str, type[Preprocessor]] = {
    cls.kind.value: cls for cls in (TextPreprocessor, AudioPreprocessor, ImagePreprocessor, VideoPreprocessor)
}


def create(manifest: Manifest, tokenizer: Tokenizer | None) -> Preprocessor:
    """The preprocessor of the model's input kind."""
    return KINDS[manifest.input.kind](manifest, tokenizer)
