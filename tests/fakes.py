"""Test doubles shared by several test files: a fake engine and a runtime wrapper that records decode steps.

Fixtures that serve them live in conftest.py; test files import the classes from here (tests/ is on
sys.path, as it has no __init__.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import pathlib
import threading

from attnserve.api import generation
from attnserve.server.edge import serve_options
from attnserve.api.generation import GenerationResult, ModelInfo, StreamedToken, Token

WAIT = 30  # seconds; only guards against hangs, never measures anything


class FakeEngine:
    """Stand-in for `engine.ModelEngine`: "translates" by reversing characters, on one worker thread.

    Output token i attends only to source character n-1-i (a reversed diagonal), so every attention row is
    known in advance. Attributes a test may set (`reset` restores them):
        gate: clear it to hold the worker before it starts a request.
        fail: an exception the worker raises instead of answering (after validation: a server fault).
        reject: an exception `submit` raises, as validation does before anything is queued.
        drop: submit returns an already-cancelled future, as an engine that is closing would.
        pause_after_first: the worker waits after a request's first token until the request is
            cancelled, as a long decode would, then ends it with CancelledError; `paused` is set
            while it waits.
    """

    max_rows = 64  # as a continuously batching engine states its --max-rows

    def __init__(self, name: str = "fake-translate"):
        languages = ["en", "zh-TW"]
        self.info = ModelInfo(name, 3, "translation", "reverses its input", languages, languages, 32, 8, 2, 4)
        self.gate = threading.Event()
        self.reset()
        self.closed = False
        self.requests: list[generation.GenerationRequest] = []
        self.futures: list[concurrent.futures.Future] = []  # of the requests the worker got
        self._stops: dict[concurrent.futures.Future, threading.Event] = {}  # set by cancel() while running
        self._worker = concurrent.futures.ThreadPoolExecutor(1)

    def reset(self) -> None:
        self.gate.set()
        self.fail = None
        self.reject = None
        self.drop = False
        self.pause_after_first = False
        self.paused = threading.Event()

    def submit(self, request, on_token=None) -> concurrent.futures.Future:
        if self.reject is not None:
            raise self.reject
        if request.target_language not in ("", *self.info.target_languages):
            raise ValueError(f"unknown target language {request.target_language!r}")
        self.requests.append(request)
        future = concurrent.futures.Future()
        if self.drop:
            future.cancel()
            return future
        self._stops[future] = threading.Event()
        self.futures.append(future)
        self._worker.submit(self._run, future, request, on_token)
        return future

    def cancel(self, future: concurrent.futures.Future) -> None:
        """As ModelEngine.cancel: a queued request is dropped, a running one ends after its current token."""
        if not future.cancel() and future in self._stops:
            self._stops[future].set()

    def generate(self, request) -> GenerationResult:
        """The offline result: what `submit` computes, without a server."""
        return self._generate(request, None, threading.Event())

    def close(self, timeout: float | None = None) -> None:
        self.closed = True
        self._worker.shutdown(wait=True)

    def _run(self, future: concurrent.futures.Future, request, on_token) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(self._generate(request, on_token, self._stops[future]))
        except BaseException as exc:
            future.set_exception(exc)

    def _generate(self, request, on_token, stop: threading.Event) -> GenerationResult:
        self.gate.wait()
        if self.fail is not None:
            raise self.fail
        source = [Token(ch, ord(ch), 0.0) for ch in request.text] + [Token("</s>", 2, 0.0)]
        limit = request.decoding.max_new_tokens or self.info.max_new_tokens
        output = request.text[::-1][:limit]
        tokens = [Token(ch, ord(ch), -0.25 * (i + 1)) for i, ch in enumerate(output)]
        n = len(request.text)
        weights = [[1.0 if c == n - 1 - r else 0.0 for c in range(len(source))] for r in range(len(tokens))]
        for index, (token, row) in enumerate(zip(tokens, weights)):
            if on_token is not None:
                on_token(StreamedToken(index, token, row if request.attention.enabled else None, token.piece))
            if index == 0 and self.pause_after_first:
                self.paused.set()
                assert stop.wait(WAIT), "the paused request was never cancelled"
            if stop.is_set():
                raise concurrent.futures.CancelledError("the caller cancelled the request")
        attention = generation.AttentionMatrix(
            weights, [t.piece for t in tokens], [t.piece for t in source], 1, "layer 1 of 2, fake"
        )
        return GenerationResult(
            model=self.info.name,
            text=output,
            target_language=request.target_language or "en",
            tokens=tokens,
            source_tokens=source,
            finish_reason=generation.FinishReason.LENGTH if len(output) < n else generation.FinishReason.EOS,
            attention=attention if request.attention.enabled else None,
            timings=generation.Timings(0.001, 0.002, 0.003, 0.004, 0.01, 1),
        )



class FakeCopyEngine(FakeEngine):
    """A second fake architecture, for comparisons: "translates" by copying its input, not reversing it.

    Each output character attends to its own source character (a monotonic diagonal, as a recurrent
    model's Bahdanau attention often is) and the matrix names its own reduction. Streamed tokens still arrive in
    FakeEngine's (reversed) order; the final result is the copy.
    """

    REDUCTION = "layer 0 of 1, Bahdanau (additive), fake"

    def __init__(self, name: str = "fake-copy"):
        super().__init__(name)
        self.info = dataclasses.replace(self.info, description="copies its input", attention_layers=1)

    def _generate(self, request, on_token, stop: threading.Event) -> GenerationResult:
        result = super()._generate(request, on_token, stop)
        attention = result.attention
        if attention is not None:
            attention = dataclasses.replace(
                attention,
                weights=attention.weights[::-1],
                row_labels=attention.row_labels[::-1],
                layer=0,
                reduction=self.REDUCTION,
            )
        return dataclasses.replace(result, text=result.text[::-1], tokens=result.tokens[::-1], attention=attention)

class RecordingRuntime:
    """Wraps a `runtime.Runtime`: records which rows every decoder call ran, and can hold a call.

    Attributes:
        steps: per decoder call, the source length of each of its rows (its encoder mask's sum), which
            tells the requests of a batch apart when their sources differ in length.
        hold: decoder call number (counted from 0) -> Event that call waits for before it runs.
        holding: set once a held call has started waiting.
    """

    def __init__(self, runtime, source_mask: str):
        self.runtime = runtime
        self.variant = runtime.variant
        self.decoder_bytes = runtime.decoder_bytes
        self.source_mask = source_mask  # the decoder input that carries the encoder's attention mask
        self.steps: list[list[int]] = []
        self.hold: dict[int, threading.Event] = {}
        self.holding = threading.Event()

    def encode(self, feeds):
        return self.runtime.encode(feeds)

    def decode_step(self, feeds, residency=None):
        gate = self.hold.get(len(self.steps))
        if gate is not None:
            self.holding.set()
            assert gate.wait(WAIT), f"decoder call {len(self.steps)} was held and never released"
        self.steps.append(feeds[self.source_mask].sum(axis=1).tolist())
        return self.runtime.decode_step(feeds, residency)

    def calls_with(self, source_length: int) -> int:
        """How many decoder calls ran a row with this source length."""
        return sum(source_length in rows for rows in self.steps)


def recording_engine(repository: pathlib.Path, name: str, batching=None, wrap=None):
    """A ModelEngine for model `name` of `repository` whose runtime is a RecordingRuntime (wrapped by
    `wrap(recording)` when given: the engine's runtime is then what `wrap` returns).

    Returns:
        (engine, recording runtime); close the engine when done.
    """
    from attnserve.server.engine.batcher import BatchingOptions
    from attnserve.server.engine.engine import ModelEngine
    from attnserve.server.model.repository import find_models, open_runtime
    from attnserve.server.model.tokenization import Tokenizer

    version = find_models(repository)[name]
    manifest = version.manifest
    mask = next(s.target for s in manifest.static if s.source == manifest.encoder.inputs["attention_mask"])
    runtime = RecordingRuntime(open_runtime(version), mask)
    tokenizer = Tokenizer.from_manifest(version.path, manifest)
    engine = ModelEngine(version, wrap(runtime) if wrap else runtime, tokenizer, batching or BatchingOptions())
    return engine, runtime


# ---- starting requests together, in either batching mode -----------------------------------------------

# The worker modes of `BatchingOptions` (`--batching`), for tests whose claim holds for both: continuous
# batching (the default) and windowed batches.
BATCHING_MODES = serve_options.BATCHING_MODES


def batching(mode: str, max_batch_size: int = 16):
    """BatchingOptions of one of BATCHING_MODES in which what `held` queues starts together.

    The windowed mode waits for no window: the requests queued while the worker was held are all there
    when it takes its next batch, so they fill it up to `max_batch_size` at once.
    """
    from attnserve.server.engine.batcher import BatchingOptions

    if mode == "window":
        return BatchingOptions(max_batch_size, window_ms=0.0, continuous=None)
    return BatchingOptions(max_batch_size)


@contextlib.contextmanager
def held(engine, gate: generation.GenerationRequest):
    """Holds the engine's worker while the block runs; what the block submits starts together after it.

    The worker is held inside the token callback of `gate`, cut to one token, so nothing else runs and
    everything submitted meanwhile waits in the queue. Released, the worker takes the queue at once: as
    one windowed batch or, under continuous batching, admitted at one step boundary and encoded together
    (up to max_batch_size either way), while the gate has already left.
    """
    entered, release = threading.Event(), threading.Event()

    def hold(token):
        entered.set()
        assert release.wait(WAIT), "the worker was held and never released"

    one = generation.DecodingOptions(max_new_tokens=1, min_new_tokens=1)  # one token: one callback
    future = engine.submit(dataclasses.replace(gate, decoding=one, attention=generation.AttentionOptions()), hold)
    try:
        assert entered.wait(WAIT), "the gate request never streamed its token"
        yield
    finally:
        release.set()
    assert len(future.result(WAIT).tokens) == 1


def generate_together(repo, name: str, mode: str, requests) -> list:
    """Results of `requests` decoded as one batch by a fresh engine for model `name` of `repo` (batching
    `mode`), asserting that they did share one batch."""
    from attnserve.server.engine.registry import load_engine
    from attnserve.server.model.repository import find_models
    from attnserve.server.model.runtime import RuntimeOptions

    engine = load_engine(find_models(repo)[name], RuntimeOptions(), batching(mode, len(requests)))
    try:
        results = [f.result(WAIT) for f in submit_together(engine, requests)]
    finally:
        engine.close()
    assert {r.timings.batch_size for r in results} == {len(requests)}
    return results


def submit_together(engine, requests, on_tokens=None) -> list[concurrent.futures.Future]:
    """Submits `requests` (with their token callbacks) so that they start together; returns their futures."""
    on_tokens = on_tokens or [None] * len(requests)
    with held(engine, requests[0]):
        return [engine.submit(request, on_token) for request, on_token in zip(requests, on_tokens)]


# Requests of mixed source lengths and both directions, shared by the decoding and engine tests, with the
# max_new_tokens each gets: the longest source (index 4) stops first, so a batch trims its source padding
# mid-decode.
MIXED_TEXTS = [
    "Open the File menu, then choose Save.",
    "知識就是力量。",
    "今天天氣很好，我們去公園散步吧！",
    "Save",
    "The weather is nice today, let's take a walk in the park!",
    "這個按鈕",
    "用 Python 寫程式很有趣",
    "This button closes the window",
]
MIXED_MAX_NEW = [40, 12, 33, 40, 2, 26, 40, 7]


# ---- audio and image inputs ----------------------------------------------------------------------------


def wav_bytes(samples, rate: int, sample_format: str = "pcm16", extensible: bool = False, extra_chunk: bool = False):
    """A WAV file holding `samples` ((N,) mono or (N, C) channels, floats in [-1, 1]).

    Args:
        sample_format: "pcm16", "pcm32", "float32", "float64", or "pcm24" / "pcm8" (which the server refuses).
        extensible: write a WAVE_FORMAT_EXTENSIBLE fmt chunk (sub-format GUID) instead of a plain one.
        extra_chunk: put an odd-sized LIST chunk (padded to even) before the data chunk.
    """
    import struct

    import numpy as np

    x = np.asarray(samples, dtype=np.float64)
    x = x[:, None] if x.ndim == 1 else x
    channels = x.shape[1]
    tag, bits, body = {
        "pcm16": (1, 16, lambda: np.round(x * 32767).astype("<i2").tobytes()),
        "pcm32": (1, 32, lambda: np.round(x * 2147483647).astype("<i4").tobytes()),
        "float32": (3, 32, lambda: x.astype("<f4").tobytes()),
        "float64": (3, 64, lambda: x.astype("<f8").tobytes()),
        "pcm24": (1, 24, lambda: b"".join(int(v * 8388607).to_bytes(3, "little", signed=True) for v in x.ravel())),
        "pcm8": (1, 8, lambda: np.round(x * 127 + 128).astype(np.uint8).tobytes()),
    }[sample_format]
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 0xFFFE if extensible else tag, channels, rate, rate * block, block, bits)
    if extensible:
        guid_tail = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        fmt += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", tag) + guid_tail
    data = body()
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    if extra_chunk:
        chunks += b"LIST" + struct.pack("<I", 3) + b"abc" + b"\x00"
    chunks += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def speller_manifest() -> dict:
    """The LSTM speller (listen, attend and spell) manifest of docs/model-contract.md."""
    state = [
        ("past_state.hidden", "present_state.hidden", 320, {"from": "initial_state.hidden"}),
        ("past_state.cell", "present_state.cell", 320, {"from": "initial_state.cell"}),
        ("past_state.context", "present_state.context", 512, "zeros"),
        ("past_state.attention", "present_state.attention", "source", "zeros"),
    ]
    return {
        "format_version": 1,
        "name": "speech-en",
        "version": 1,
        "task": "speech-recognition",
        "description": "English speech recognizer: pyramid BiLSTM listener + attentional LSTM speller",
        "languages": {"source": ["en"], "target": ["en"]},
        "tokenizer": {"file": "tokenizer.json", "word_boundary": "metaspace-cjk"},
        "special_tokens": {"pad": 0, "unk": 1, "eos": 2, "suppress": [0, 3]},
        "decoder_start": {"en": 3},
        "input": {
            "kind": "audio",
            "sample_rate_hz": 16000,
            "features": {"type": "log-mel", "n_mels": 80, "window_ms": 25, "shift_ms": 10, "n_fft": 512,
                         "log_floor": 1e-10},
            "time_reduction": 4,
            "max_seconds": 30,
            "max_bytes": 16777216,
        },
        "limits": {"max_new_tokens": 400},
        "attention": {"output": "cross_attentions", "layers": 1, "heads": 1},
        "encoder": {"file": "encoder.onnx",
                    "inputs": {"input_features": "input_features", "attention_mask": "attention_mask"},
                    "length_hint": {"output": "ctc_length", "scale": 1.0, "offset": 3}},
        "decoder": {"file": "decoder.onnx", "inputs": {"input_ids": "input_ids"}, "outputs": {"logits": "logits"}},
        "static": [
            {"from": "encoder_attention_mask", "to": "encoder_attention_mask", "batch_axis": 0, "source_axis": 1},
            {"from": "encoder_hidden_states", "to": "encoder_hidden_states", "batch_axis": 0, "source_axis": 1},
        ],
        "state": [
            {"input": i, "output": o, "update": "replace", "batch_axis": 0, "dtype": "float32", "shape": ["batch", n],
             "init": init}
            for i, o, n, init in state
        ],
    }


def captioner_manifest() -> dict:
    """An image-captioning manifest: 224 x 224 RGB, ImageNet normalisation, a 7 x 7 grid of cells."""
    manifest = speller_manifest()
    manifest.update(name="caption-en", task="image-captioning", description="image captioner")
    manifest["input"] = {
        "kind": "image",
        "height": 224,
        "width": 224,
        "channels": 3,
        "normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
        "grid": {"rows": 7, "cols": 7},
        "max_bytes": 8388608,
    }
    manifest["encoder"]["inputs"] = {"pixel_values": "pixel_values"}
    return manifest
