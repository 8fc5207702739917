"""The request as the decode loop consumes it: validated, its input preprocessed, resolved against its model.

server/engine/validation.py builds it from a `GenerationRequest`; the strategies (server/decoding/search.py), the output
rules and the result builder read it; server/engine/reranking.py derives forced requests from it.
"""

from __future__ import annotations

import dataclasses

from attnserve.api.generation import AttentionReduction, GenerationRequest, SamplingOptions
from attnserve.server.inputs.preprocessing import Source
from attnserve.server.decoding.hotwords import HotwordBias
from attnserve.server.decoding.prompt import ForcedStart


@dataclasses.dataclass(frozen=True)
class PreparedRequest:
    """A validated request, its input preprocessed and resolved against its model; what the decode loop consumes."""

    request: GenerationRequest
    # The input as its kind's preprocessor prepared it (token ids, log-mel frames, pixels).
    source: Source
    # The resolved target language and the decoder start token for it.
    target_language: str
    start_id: int
    # Resolved limit on generated tokens (EOS not counted), >= 1.
    max_new_tokens: int
    beam_size: int
    # Non-negative decoder layer of the returned attention; None when no attention was asked for.
    attention_layer: int | None
    # Decoder layer whose attention gives word timestamps (audio input); None when there are none.
    timestamp_layer: int | None = None
    # How many of the best sequences to return (<= beam_size).
    num_return_sequences: int = 1
    # EOS is forbidden before this many tokens; 0 = no minimum.
    min_new_tokens: int = 0
    # No n-gram of this size repeats in the output; 0 = no guard.
    no_repeat_ngram_size: int = 0
    # Sample each token (beam_size 1); its seed is always set here. None = greedy or beam search.
    sampling: SamplingOptions | None = None
    # Non-negative heads of attention_layer to combine (empty = all), and how.
    attention_heads: tuple[int, ...] = ()
    attention_reduction: AttentionReduction = AttentionReduction.MEAN
    # Tokens every step takes, EOS last (greedy rows only): the request scores this output instead of
    # searching one (server/engine/reranking.py builds such requests). None = search.
    forced_ids: tuple[int, ...] | None = None
    # DecodingOptions.reverse_weight > 0: the language to translate the candidates back into.
    reverse_language: str | None = None
    # The tokens the first steps must output (NLLB's target-language token, Whisper's prompt) and what the
    # step after them must not (server/decoding/prompt.py); None = the model chooses from the start.
    forced_start: ForcedStart | None = None
    # Beam search stops once beam_size sequences are finished (manifest decoding.early_stopping).
    early_stopping: bool = False
    # Glossary terms the output must contain (server/decoding/glossary.py Constraint); () = none.
    constraints: tuple = ()
    # Audio read at several speeds (server/engine/speed_readings.py): this reading's playback speed. None =
    # the request as given, not yet read.
    speed: float | None = None
    # Words the search is biased towards (DecodingOptions.hotwords): a hotwords.HotwordBias; None = none.
    hotwords: HotwordBias | None = None

    def forcing(self, ids: tuple[int, ...], **changes) -> PreparedRequest:
        """This request made one that scores the output `ids` (greedy, one sequence, not reranked), with
        `changes` on top: how reranking and the word LM get a chosen candidate's own score and attention."""
        return dataclasses.replace(self, forced_ids=ids, max_new_tokens=len(ids), beam_size=1,
                                   num_return_sequences=1, reverse_language=None, **changes)

    @property
    def keeps_attention(self) -> bool:
        """Whether decoding must keep this request's attention (returned, or read for timestamps)."""
        return self.attention_layer is not None or self.timestamp_layer is not None
