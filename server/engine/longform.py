"""Long-form audio: a recording longer than the model's window, cut at pauses, transcribed segment by segment.

`LongFormEngine` wraps a model's engine (in this process or behind --engine-process: it needs only
`submit` and `cancel`) and leaves every request it need not touch to it unchanged: text, images, and audio
within the window in the WAV format the engine reads. For the others, `submit`:

  1. checks the long-form limits from the file's header, and for a recording longer than the window the
     options it cannot have (no attention matrix over an hour, no n-best), before decoding anything big
     (server/inputs/audio_files.py);
  2. decodes the file (WAV, FLAC, Ogg, MP3, M4A) to mono and resamples it to the model's rate;
  3. audio within the window goes on as one ordinary request of raw samples; longer audio is cut at its
     pauses into segments no longer than the window (server/inputs/segmentation.py);
  4. submits the segments as ordinary requests of their samples, `segments_in_flight` at a time, so that
     they decode as rows of the same batches (with each other and with other clients' requests) while
     the queue never holds a whole hour of one client;
  5. as each segment finishes, shifts its word times by the segment's start, hands it to the stream
     (`on_token` receives `TranscriptSegment`s) and submits the next; when all are done, joins them into
     one result.

Long recordings are bounded per model (`max_recordings`) and per client (`max_recordings_per_client`, for
requests whose caller says who sent them: the gRPC service passes the client's key), counted from before
the file is decoded until the request ends: finished, failed or cancelled. Past either bound a request is
refused (OverloadedError) before anything is decoded.

Cancelling the request cancels the segments in flight and submits no more. A segment that fails fails the
request. Submissions after the first batch run on a small thread pool, never on the engine's worker thread
(its done-callbacks), since preparing a segment computes its features.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future

import numpy as np

from attnserve.server.engine import limits
from attnserve.server.model.option_fields import bounded, check
from attnserve.server.inputs import audio_files, segmentation
from attnserve.server.inputs.audio import rate_ratio, resample
from attnserve.api.generation import (
    AudioInput,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    InputKind,
    InputTooLargeError,
    ModelInfo,
    OverloadedError,
    Timings,
    TranscriptSegment,
    UnavailableError,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LongFormOptions:
    """What long-form requests may be and how they are cut."""

    # Longest accepted recording, in seconds; 0 = no long-form (the model's window is the limit).
    max_seconds: float = 3600.0
    # Largest accepted file, in bytes: an hour of 16 kHz 16-bit mono WAV (115.2 MB) fits.
    max_bytes: int = 128 * 2**20
    # Segments of one request submitted at once: they decode together as batch rows.
    segments_in_flight: int = bounded(8, least=1)
    # Long recordings decoding or being transcribed at once, per model; more are RESOURCE_EXHAUSTED. Each
    # holds its decoded samples until its last segment is done (an hour at 16 kHz: 230 MB), so this bounds
    # the memory of concurrent uploads, which the request-bytes and decoded-bytes budgets free earlier.
    max_recordings: int = bounded(4, least=1)
    # Of those, the most one client may have (the service's key: its bearer token, else its IP address), so
    # that one client's hour-long uploads cannot hold every slot; requests that name no client (in-process
    # callers, the warm-up) are bound by max_recordings only. At most max_recordings.
    max_recordings_per_client: int = bounded(2, least=1)
    # The WebRTC VAD's aggressiveness, 0..3 (server/inputs/segmentation.py); None = the energy detector.
    vad_aggressiveness: int | None = 2
    # How the recording is cut; its max_seconds is replaced by the model's window.
    segmentation: segmentation.SegmentationOptions = segmentation.SegmentationOptions(max_seconds=1.0)

    def __post_init__(self):
        more = self.max_recordings_per_client > self.max_recordings
        check(self, [f"LongFormOptions.max_recordings_per_client {self.max_recordings_per_client} is more than "
                     f"max_recordings {self.max_recordings}"] if more else [])


@dataclasses.dataclass(frozen=True)
class _Recording:
    """A decoded recording at the model's rate."""

    samples: np.ndarray  # (N,) float32 mono
    rate: int


class LongFormEngine:
    """A model's engine that also transcribes audio longer than its window (see the module docstring).

    Args:
        engine: the model's engine (server/engine/engine.py's ModelEngine or engine_process's ProcessEngine).
        options: the long-form limits and cutting.
    """

    def __init__(self, engine, options: LongFormOptions = LongFormOptions()):
        self._engine = engine
        self.options = options
        inner = engine.info
        self._window = inner.audio.max_seconds
        self._rate = inner.audio.sample_rate_hz
        self._cutting = dataclasses.replace(options.segmentation, max_seconds=self._window)
        self._detector = (segmentation.WebRtcDetector(options.vad_aggressiveness)
                          if options.vad_aggressiveness is not None else segmentation.EnergyDetector())
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="longform")
        self._jobs: dict[Future, _Transcription] = {}
        self._decoding = 0  # recordings being decoded, not yet in _jobs
        self._clients: dict[str, int] = {}  # client key -> its recordings being decoded or in _jobs
        self._lock = threading.Lock()
        audio = dataclasses.replace(inner.audio, long_form_max_seconds=options.max_seconds,
                                    long_form_max_bytes=options.max_bytes, formats=audio_files.formats())
        largest = max(audio.max_bytes, options.max_bytes)
        self.info: ModelInfo = dataclasses.replace(inner, audio=audio,
                                                   max_request_bytes=limits.request_bytes(largest))

    @property
    def on_exit(self):
        """An engine in a child process reports its death here (app.py sets it); others have none."""
        return self._engine.on_exit

    @on_exit.setter
    def on_exit(self, callback) -> None:
        self._engine.on_exit = callback

    def __getattr__(self, name: str):
        return getattr(self._engine, name)  # queued(), running_rows(), providers, ...

    def submit(self, request: GenerationRequest, on_token: Callable | None = None, client: str | None = None,
               **keywords) -> Future:
        """Submits `request`: to the engine as it is, or cut into segments (see the module docstring).

        Args:
            client: who sent it (server/edge/client_keys.py), for max_recordings_per_client; None = bound by
                max_recordings only. Not passed on: the engine has no use for it.

        Raises:
            ValueError: a bad request (as the engine's submit), an unreadable file, options a long-form
                request cannot have. InputTooLargeError: over the long-form limits (the message names them).
                OverloadedError: over max_recordings or max_recordings_per_client.
        """
        audio = request.audio
        if audio is None or self._engine_reads(audio):
            return self._engine.submit(request, on_token, **keywords)
        self._reserve_recording(client)
        job = None
        try:
            recording = self._decode(audio, request)
            seconds = len(recording.samples) / recording.rate
            if seconds <= self._window:
                samples = AudioInput(samples=recording.samples, sample_rate_hz=recording.rate)
                return self._engine.submit(dataclasses.replace(request, audio=samples), on_token, **keywords)
            spans = segmentation.segment(recording.samples, recording.rate, self._cutting, self._detector)
            job = _Transcription(self._engine, self._pool, request, recording, spans, on_token,
                                 self.options.segments_in_flight, functools.partial(self._forget, client))
            with self._lock:
                self._jobs[job.future] = job
        finally:
            with self._lock:
                self._decoding -= 1
                if job is None:  # unusable, or within the window: not kept, so its client's slot ends here
                    self._release_client(client)
        job.start()
        return job.future

    def _reserve_recording(self, client: str | None) -> None:
        """Counts one more recording being decoded, or refuses it when its client has max_recordings_per_client
        or the model max_recordings decoding or running (the client's bound first: retrying once other
        clients' recordings end would not help it)."""
        limit, mine = self.options.max_recordings, self.options.max_recordings_per_client
        with self._lock:
            held = self._clients.get(client, 0)
            if client is not None and held >= mine:
                raise OverloadedError(
                    f"this client is already transcribing {mine} long recordings on model '{self.info.name}', its "
                    f"most at once (--max-long-form-recordings-per-client); retry later",
                    reason="long_form_recordings_per_client")
            if self._decoding + len(self._jobs) >= limit:
                raise OverloadedError(
                    f"model '{self.info.name}' is transcribing {limit} long recordings, its most at once "
                    f"(--max-long-form-recordings); retry later", reason="long_form_recordings")
            self._decoding += 1
            if client is not None:
                self._clients[client] = held + 1

    def _release_client(self, client: str | None) -> None:
        """One recording of `client` ended (called holding the lock)."""
        if client is None:
            return
        held = self._clients.pop(client) - 1
        if held:
            self._clients[client] = held  # a client with none left leaves no key behind

    def cancel(self, future: Future) -> None:
        with self._lock:
            job = self._jobs.get(future)
        if job is None:
            self._engine.cancel(future)
        else:
            job.cancel()

    def generate(self, request: GenerationRequest, timeout: float | None = None) -> GenerationResult:
        """Blocking submit(): waits for the result (TimeoutError after `timeout` seconds, which cancels it)."""
        future = self.submit(request)
        try:
            return future.result(timeout)
        finally:
            self.cancel(future)

    def close(self, *args, **keywords) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.fail(UnavailableError(f"model '{self.info.name}' is shutting down"))
        self._pool.shutdown(wait=True)
        self._engine.close(*args, **keywords)

    def _forget(self, client: str | None, future: Future) -> None:
        """A transcription ended (finished, failed or cancelled; once): it leaves _jobs and frees its slots."""
        with self._lock:
            if self._jobs.pop(future, None) is not None:
                self._release_client(client)

    def _engine_reads(self, audio: AudioInput) -> bool:
        """Whether the engine reads this audio itself: raw samples or a WAV file within its window and byte
        limit (and what it would refuse for another reason than length: it says why best)."""
        info = self._engine.info.audio
        if audio.samples is not None:
            rate = audio.sample_rate_hz
            return bool(audio.wav) or rate <= 0 or len(audio.samples) / rate <= self._window
        if not audio.wav:
            return True
        try:
            header = audio_files.probe(audio.wav) if audio_files.sniff(audio.wav) == "wav" else None
        except ValueError:
            return True
        return header is not None and header.seconds <= self._window and len(audio.wav) <= info.max_bytes

    def _check_options(self, request: GenerationRequest, seconds: float) -> None:
        """Refuses what a recording cut into segments cannot have, once its header says it will be cut."""
        if seconds <= self._window:
            return
        window = f"longer than the model's {self._window:g} s window"
        if request.attention.enabled:
            raise ValueError(f"attention is not returned for long-form audio ({window}): ask without attention, "
                             "or send at most the window")
        if request.decoding.num_return_sequences > 1:
            raise ValueError(f"num_return_sequences {request.decoding.num_return_sequences} is not available for "
                             f"long-form audio ({window}): use 1")

    def _decode(self, audio: AudioInput, request: GenerationRequest) -> _Recording:
        """The request's audio at the model's rate, after every limit and option check that its header can tell.

        Raises:
            InputTooLargeError: over long_form_max_bytes or long_form_max_seconds. ValueError: unusable, or
                options a long recording cannot have.
        """
        name, o = self.info.name, self.options
        size = len(audio.wav) if audio.samples is None else 4 * len(audio.samples)
        if size > o.max_bytes:
            raise InputTooLargeError(f"audio is {size} bytes; model '{name}' accepts at most {o.max_bytes} bytes "
                                     f"(long_form_max_bytes)")
        if audio.samples is not None:
            if audio.wav:
                raise ValueError("set one of AudioInput data (an audio file) and samples, not both")
            self._check_header(audio.sample_rate_hz, len(audio.samples))
            self._check_options(request, len(audio.samples) / audio.sample_rate_hz)
            samples, rate = np.asarray(audio.samples, dtype=np.float32).reshape(-1), audio.sample_rate_hz
        else:
            header = audio_files.probe(audio.wav)
            if audio.sample_rate_hz not in (0, header.sample_rate_hz):
                raise ValueError(f"sample_rate_hz {audio.sample_rate_hz} differs from the file's "
                                 f"{header.sample_rate_hz} Hz; leave it 0 for audio files")
            self._check_header(header.sample_rate_hz, header.frames)
            self._check_options(request, header.seconds)
            samples, rate = audio_files.decode(audio.wav, header), header.sample_rate_hz
            self._check_header(rate, len(samples))  # a header's duration may be an estimate (MP3)
            self._check_options(request, len(samples) / rate)
        if not np.isfinite(samples).all():
            raise ValueError("audio holds non-finite samples (NaN or infinity)")
        return _Recording(resample(samples, rate, self._rate), self._rate)

    def _check_header(self, rate: int, frames: int) -> None:
        if rate <= 0:
            raise ValueError("raw audio samples need their sample_rate_hz")
        rate_ratio(rate, self._rate)
        if frames == 0:
            raise ValueError("audio is empty: it holds no samples")
        seconds, limit = frames / rate, self.options.max_seconds
        if seconds > limit:
            raise InputTooLargeError(f"audio is {seconds:.2f} s long; model '{self.info.name}' accepts at most "
                                     f"{limit:g} s (long_form_max_seconds; cut into segments of at most "
                                     f"{self._window:g} s)")


class _Transcription:
    """One long-form request: its segments submitted a window at a time, answered when all are done."""

    def __init__(self, engine, pool, request: GenerationRequest, recording: _Recording,
                 spans: list[segmentation.Segment], on_segment: Callable | None, in_flight: int,
                 forget: Callable[[Future], None]):
        self._engine, self._pool, self._request = engine, pool, request
        self._recording, self._spans, self._on_segment = recording, spans, on_segment
        self._in_flight, self._forget = in_flight, forget
        self.future: Future[GenerationResult] = Future()
        self.future.set_running_or_notify_cancel()
        self._accepted = time.perf_counter()
        self._lock = threading.Lock()
        self._next = 0  # the next segment to submit
        self._running: dict[int, Future] = {}
        self._done: list[tuple[GenerationResult, TranscriptSegment] | None] = [None] * len(spans)
        self._first_done: float | None = None

    def start(self) -> None:
        """Submits the first window of segments on the caller's thread, so that a request the engine refuses
        (bad options, full queue) is refused by submit() itself."""
        if not self._spans:
            self._finish()
            return
        try:
            for _ in range(min(self._in_flight, len(self._spans))):
                self._submit_next()
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        self.fail(CancelledError("the caller cancelled the request"))

    def fail(self, error: BaseException) -> None:
        """Ends the request with `error`: the segments in flight are cancelled, no more are submitted."""
        with self._lock:
            if self.future.done():
                return
            self._next = len(self._spans)
            running = list(self._running.values())
            self.future.set_exception(error)
        for future in running:
            self._engine.cancel(future)
        self._forget(self.future)

    def _submit_next(self) -> None:
        with self._lock:
            if self.future.done() or self._next >= len(self._spans):
                return
            index = self._next
            self._next += 1
        span = self._spans[index]
        samples = self._recording.samples[span.start : span.end]
        request = dataclasses.replace(
            self._request, audio=AudioInput(samples=samples, sample_rate_hz=self._recording.rate),
            request_id=f"{self._request.request_id}#{index}" if self._request.request_id else "")
        future = self._engine.submit(request)
        with self._lock:
            self._running[index] = future
        future.add_done_callback(lambda f, i=index: self._segment_done(i, f))

    def _segment_done(self, index: int, future: Future) -> None:
        """A segment's future is done (engine worker thread): record it, stream it, submit the next."""
        with self._lock:
            self._running.pop(index, None)
        if self.future.done():
            return
        if future.cancelled():
            self.fail(UnavailableError("the model dropped a segment of the request (is it shutting down?)"))
            return
        if future.exception() is not None:
            self.fail(future.exception())
            return
        result = future.result()
        segment = self._segment(index, result)
        try:
            if self._on_segment is not None:
                self._on_segment(segment)
        except Exception as exc:  # the caller's callback: fail this request only
            self.fail(exc)
            return
        with self._lock:
            self._done[index] = (result, segment)
            self._first_done = self._first_done or time.perf_counter()
            finished = all(d is not None for d in self._done)
        if finished:
            self._finish()
        else:
            self._pool.submit(self._submit_or_fail)

    def _submit_or_fail(self) -> None:
        try:
            self._submit_next()
        except BaseException as exc:  # a full queue, a closing engine
            self.fail(exc)

    def _segment(self, index: int, result: GenerationResult) -> TranscriptSegment:
        start, end = self._spans[index].seconds(self._recording.rate)
        words = [dataclasses.replace(w, start_seconds=w.start_seconds + start, end_seconds=w.end_seconds + start)
                 for w in result.words]
        return TranscriptSegment(index, len(self._spans), start, end, result.text, words, result.finish_reason)

    def _finish(self) -> None:
        with self._lock:
            if self.future.done():
                return
            self.future.set_result(self._joined())
        self._forget(self.future)

    def _joined(self) -> GenerationResult:
        """The segments' results as one (timings: see docs/api.md, "Long-form audio")."""
        done = [d for d in self._done if d is not None]
        results, segments = [r for r, _ in done], [s for _, s in done]
        now = time.perf_counter()
        lengthy = any(r.finish_reason is FinishReason.LENGTH for r in results)
        timings = Timings(
            queue_seconds=min((r.timings.queue_seconds for r in results), default=0.0),
            encode_seconds=sum(r.timings.encode_seconds for r in results),
            first_token_seconds=(self._first_done or now) - self._accepted,
            decode_seconds=sum(r.timings.decode_seconds for r in results),
            total_seconds=now - self._accepted,
            batch_size=max((r.timings.batch_size for r in results), default=0),
        )
        return GenerationResult(
            model=self._engine.info.name,
            text=" ".join(s.text for s in segments if s.text),
            target_language=results[0].target_language if results else self._request.target_language,
            tokens=[t for r in results for t in r.tokens],
            source_tokens=[],
            finish_reason=FinishReason.LENGTH if lengthy else FinishReason.EOS,
            attention=None,
            timings=timings,
            words=[w for s in segments for w in s.words],
            segments=segments,
        )


def wrap(engines: dict, options: LongFormOptions | None) -> dict:
    """Every audio model's engine wrapped for long-form audio (others as they are); None = none wrapped."""
    if options is None or options.max_seconds <= 0:
        return engines
    return {name: LongFormEngine(e, options) if e.info.input_kind is InputKind.AUDIO else e
            for name, e in engines.items()}
