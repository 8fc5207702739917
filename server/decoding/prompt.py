"""The tokens a request's output starts with before the model chooses freely: a forced first token (NLLB's
target language, `forced_first_token`) or a decoder prompt (Whisper's `<|en|> <|transcribe|>
<|notimestamps|>`, `decoder_prompt`), and the language detection that picks a prompt's first token.

Both are carried as forced outputs of the first steps (server/decoding/output_rules.py), so the decode
loop, its cache and the model's graphs stay as they are: a forced step is an ordinary step whose output
is fixed (log-probability 0), exactly as transformers' forced_bos_token_id; a prompt is fed the same way
but, as generate's decoder_input_ids, counts in no length normalisation (`prompt_length`). Speech
translation (Whisper's task=translate) is a prompt too: the source language's, with <|translate|>. A request to a
model with `detect_language` that names no language gets, at its first step, the language token the model
scores highest among the languages' (WhisperForConditionalGeneration.detect_language: one step on the
start token, argmax over the language tokens); the rest of the prompt follows as for that language.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from attnserve.server.model.manifest import Manifest

# A forced position whose token the model's first step chooses among `ForcedStart.detect_from`.
DETECT = -1


@dataclasses.dataclass(frozen=True)
class ForcedStart:
    """What a request's first output steps must be."""

    # The tokens of the first len(tokens) steps, in order; DETECT: the best of detect_from.
    tokens: tuple[int, ...] = ()
    # How many of them are a prompt (not counted as generated in beam length normalisation).
    prompt_length: int = 0
    # The language tokens a DETECT position chooses among.
    detect_from: tuple[int, ...] = ()
    # Tokens forbidden at the first step after `tokens` (Whisper's begin_suppress_tokens).
    begin_suppress: tuple[int, ...] = ()


def forced_start(manifest: Manifest, language: str, source: str = "") -> ForcedStart | None:
    """The request's forced start; `language` "" on a model with detect_language: detect it; a `source`
    language other than `language` on a model with speech_translation into it: translate from it.

    Returns:
        None when the model forces nothing.
    """
    begin = manifest.special_tokens.begin_suppress
    translation = manifest.speech_translation
    if translation and source and source != language and language == translation.target:
        prompt = translation.prompt[source]
        return ForcedStart(prompt, len(prompt), (), begin)
    if manifest.decoder_prompt:
        if not language:
            rest = next(iter(manifest.decoder_prompt.values()))[1:]
            detect = tuple(p[0] for p in manifest.decoder_prompt.values())
            return ForcedStart((DETECT, *rest), 1 + len(rest), detect, begin)
        prompt = manifest.decoder_prompt[language]
        return ForcedStart(prompt, len(prompt), (), begin)
    if language in manifest.forced_first_token:
        return ForcedStart((manifest.forced_first_token[language],), 0, (), begin)
    return ForcedStart(begin_suppress=begin) if begin else None


def detected_language(manifest: Manifest, ids: Sequence[int]) -> str:
    """The language whose decoder_prompt starts the output `ids`; "" when none does."""
    first = ids[0] if len(ids) else None
    return next((lang for lang, p in manifest.decoder_prompt.items() if p[0] == first), "")
