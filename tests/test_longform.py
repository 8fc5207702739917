"""Long-form audio (server/engine/longform.py) on the bundled recognizer: spoken sentences joined by pauses into a
recording longer than its window, served, against each segment decoded alone offline."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
import pathlib
import threading
from concurrent.futures import Future

import grpc
import numpy as np
import pytest

from attnserve.api import convert
from attnserve.clients.client import AttnServeError, Client, audio_request
from attnserve.server.edge import app
from attnserve.server.inputs import audio_files
from attnserve.server.inputs.audio import read_wav
from attnserve.server.engine.batcher import BatchingOptions
from attnserve.server.engine.registry import load_engine
from attnserve.api.generation import (
    AudioInput,
    DecodingOptions,
    GenerationRequest,
    GenerationResult,
    OverloadedError,
    TranscriptSegment,
)
from attnserve.server.engine.longform import LongFormEngine, LongFormOptions
from attnserve.server.model.repository import find_models
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from fakes import wav_bytes
from speech_clips import RATE, espeak, recording

pytestmark = pytest.mark.bundled

REPOSITORY = pathlib.Path(os.environ.get("ATTNSERVE_BUNDLED_MODELS", pathlib.Path(__file__).parents[1] / "models"))
NAME = "speech-en"
WAIT = 120
SENTENCES = ["the weather is nice today", "please open the window", "we will meet again tomorrow morning",
             "where is the train station", "i would like a cup of tea", "the meeting starts at nine",
             "turn off the lights before you leave", "she reads a book every week"]
GREEDY = DecodingOptions(beam_size=1)


@pytest.fixture(scope="module")
def spoken():
    """(WAV bytes of ~28 s, each sentence's span in seconds)."""
    clips = [espeak(s, voice=v) for s, v in zip(SENTENCES, ["en-us", "en"] * 4)]
    x, spans = recording(clips, [0.7, 1.1, 0.9, 1.3, 0.8, 1.0, 1.2, 0.9, 0.6], noise=1e-3)
    return wav_bytes(x, RATE), spans


@pytest.fixture(scope="module")
def engine():
    if NAME not in find_models(REPOSITORY):
        pytest.skip(f"no bundled {NAME} model at {REPOSITORY}")
    inner = load_engine(find_models(REPOSITORY)[NAME], batching=BatchingOptions(max_batch_size=16))
    wrapped = LongFormEngine(inner, LongFormOptions(max_seconds=90, max_bytes=4_000_000, segments_in_flight=4))
    yield wrapped
    wrapped.close()


@pytest.fixture(scope="module")
def server(engine):
    with app.BackgroundServer({NAME: engine}) as background:
        yield background


@pytest.fixture(scope="module")
def served(server):
    with Client(server.address, timeout=WAIT) as client:
        yield client


def unsure(answer):
    """A result or segment with its words' confidences dropped: they may differ in their last bits between
    two runs whose rows shared batches differently (compared to a tolerance instead)."""
    words = [dataclasses.replace(w, confidence=None) for w in answer.words]
    if isinstance(answer, GenerationResult):
        return dataclasses.replace(answer, words=words, segments=[unsure(s) for s in answer.segments])
    return dataclasses.replace(answer, words=words)


def request(data: bytes, decoding: DecodingOptions = GREEDY, **options) -> GenerationRequest:
    return dataclasses.replace(audio_request(data, model=NAME, **options), decoding=decoding)


@pytest.fixture(scope="module")
def unary(served, spoken):
    return served.generate(request(spoken[0]))


def test_every_sentence_is_a_segment_and_its_words_are_timed_from_the_recordings_start(unary, spoken):
    _, spans = spoken
    assert len(unary.segments) == len(spans)
    assert [s.index for s in unary.segments] == list(range(len(spans)))
    starts = [w.start_seconds for w in unary.words]
    assert starts == sorted(starts) and unary.words == [w for s in unary.segments for w in s.words]
    for segment, (start, end) in zip(unary.segments, spans):
        assert segment.start_seconds <= start + 0.05 and segment.end_seconds >= end - 0.05
        assert segment.words, segment
        # Absolute times: inside the segment, near the sentence the synthesizer said there. The end is looser:
        # a misheard last word can be shorter than the one said (speech-en 9 greedy hears "tomorrow morning"
        # as "to my ro..."), while a wrong offset would move both ends by a pause (0.7 s or more) at least.
        assert all(segment.start_seconds <= w.start_seconds < w.end_seconds <= segment.end_seconds + 1e-6
                   for w in segment.words)
        assert abs(segment.words[0].start_seconds - start) < 0.3 and abs(segment.words[-1].end_seconds - end) < 0.6
    assert unary.text == " ".join(s.text for s in unary.segments)
    # The undertrained recognizer mishears some words; a broken cut or offset would lose whole sentences.
    heard = sum(w in unary.text.split() for s in SENTENCES for w in s.split())
    assert heard >= 0.6 * sum(len(s.split()) for s in SENTENCES)


def test_served_segments_decoded_together_equal_each_segment_decoded_alone(engine, unary, spoken):
    samples = read_wav(spoken[0]).samples()
    assert unary.timings.batch_size > 1  # the segments shared batches
    for segment in unary.segments:
        lo, hi = round(segment.start_seconds * RATE), round(segment.end_seconds * RATE)
        alone = engine.generate(GenerationRequest(NAME, audio=AudioInput(samples=samples[lo:hi], sample_rate_hz=RATE),
                                                  decoding=GREEDY), WAIT)
        assert alone.text == segment.text
        offset = segment.start_seconds
        assert [(w.word, w.start_seconds + offset, w.end_seconds + offset) for w in alone.words] == [
            (w.word, w.start_seconds, w.end_seconds) for w in segment.words]


def test_the_stream_sends_every_segment_then_the_unary_result(served, unary, spoken):
    events = list(served.stream(request(spoken[0])))
    segments, final = events[:-1], events[-1]
    assert all(isinstance(e, TranscriptSegment) for e in segments) and isinstance(final, GenerationResult)
    assert ([unsure(s) for s in sorted(segments, key=lambda s: s.index)] == [unsure(s) for s in unary.segments]
            == [unsure(s) for s in final.segments])
    assert unsure(dataclasses.replace(final, timings=unary.timings, tokens=unary.tokens)) == unsure(unary)
    # Rows batched with other rows may differ in the last bits of their log-probabilities, never in tokens;
    # so may the word confidences read from them.
    assert [(t.piece, t.id) for t in final.tokens] == [(t.piece, t.id) for t in unary.tokens]
    np.testing.assert_allclose([t.logprob for t in final.tokens], [t.logprob for t in unary.tokens], atol=1e-4)
    np.testing.assert_allclose([w.confidence for w in final.words], [w.confidence for w in unary.words], atol=1e-4)


def test_a_lossless_flac_file_transcribes_as_its_wav(served, unary, spoken):
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, read_wav(spoken[0]).samples(), RATE, format="FLAC", subtype="PCM_16")
    flac = served.generate(request(out.getvalue()))
    assert [unsure(s) for s in flac.segments] == [unsure(s) for s in unary.segments]
    np.testing.assert_allclose([w.confidence for w in flac.words], [w.confidence for w in unary.words], atol=1e-4)


def test_an_mp3_file_is_cut_into_the_same_sentences(served, spoken):
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, read_wav(spoken[0]).samples(), RATE, format="MP3")
    mp3 = served.generate(request(out.getvalue()))
    assert len(mp3.segments) == len(spoken[1]) and all(s.words for s in mp3.segments)


def test_cancelling_stops_the_remaining_segments(engine, spoken):
    # One segment in flight at a time; cancel when the first is done: no later segment is submitted.
    counting = _Counting(engine._engine)
    one = LongFormEngine(counting, LongFormOptions(max_seconds=90, max_bytes=4_000_000, segments_in_flight=1))
    first = threading.Event()
    future = one.submit(request(spoken[0]), on_token=lambda segment: first.set())
    assert first.wait(WAIT)
    one.cancel(future)
    with pytest.raises(Exception) as caught:
        future.result(WAIT)
    assert type(caught.value).__name__ == "CancelledError"
    assert counting.submitted <= 2 < len(spoken[1])  # the first, and at most the one submitted as it ended


def test_a_stream_left_early_stops_decoding_on_the_server(served, engine, spoken):
    for event in served.stream(request(spoken[0])):
        assert isinstance(event, TranscriptSegment)
        break  # leaving the loop cancels the call
    # The server's job for the call is gone: it finished nothing more and holds no request.
    for _ in range(100):
        if not engine._jobs:
            break
        threading.Event().wait(0.05)
    assert not engine._jobs


def test_get_model_states_the_long_form_limits(served, server, capsys):
    from attnserve.clients import cli

    info = served.get_model(NAME)
    assert info.audio.long_form_max_seconds == 90 and info.audio.long_form_max_bytes == 4_000_000
    assert info.audio.max_seconds == 20 and {"wav", "flac", "ogg", "mp3"} <= set(info.audio.formats)
    assert info.max_request_bytes > 4_000_000
    assert cli.main(["models", "--address", server.address]) == 0
    assert "at most 20 s and 16777216 bytes (longer, cut at pauses: up to 90 s and 4000000 bytes)" in (
        capsys.readouterr().out)


def test_limits_are_refused_with_the_limit_named(served, monkeypatch):
    too_many_bytes = wav_bytes(np.zeros(2_100_000), RATE)  # 4.2 MB, 131 s
    with pytest.raises(AttnServeError) as caught:
        served.generate(request(too_many_bytes))
    assert caught.value.code is grpc.StatusCode.OUT_OF_RANGE
    assert "accepts at most 4000000 bytes (long_form_max_bytes)" in caught.value.details
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, np.zeros(91 * 8000), 8000, format="FLAC")  # 91 s of silence: a small file
    monkeypatch.setattr(audio_files, "decode", _never)  # refused from the header alone
    with pytest.raises(AttnServeError) as caught:
        served.generate(request(out.getvalue()))
    assert caught.value.code is grpc.StatusCode.OUT_OF_RANGE
    assert "audio is 91.00 s long; model 'speech-en' accepts at most 90 s (long_form_max_seconds" in caught.value.details


@pytest.mark.parametrize("options, message", [
    (dict(attention=True), "attention is not returned for long-form audio"),
    (dict(decoding=DecodingOptions(beam_size=2, num_return_sequences=2)), "num_return_sequences 2 is not available"),
])
def test_options_a_long_recording_cannot_have_are_invalid(served, spoken, options, message):
    with pytest.raises(AttnServeError) as caught:
        served.generate(request(spoken[0], **options))
    assert caught.value.code is grpc.StatusCode.INVALID_ARGUMENT and message in caught.value.details


def test_a_file_that_is_no_audio_is_invalid(served):
    with pytest.raises(AttnServeError) as caught:
        served.generate(request(b"ID3" + bytes(5000)))
    assert caught.value.code is grpc.StatusCode.INVALID_ARGUMENT and "cannot read the MP3 file" in caught.value.details


def test_a_short_mp3_is_an_ordinary_request_of_its_samples_with_attention(served, engine, spoken):
    import soundfile

    out = io.BytesIO()
    soundfile.write(out, read_wav(spoken[0]).samples()[: 4 * RATE], RATE, format="MP3")
    result = served.generate(request(out.getvalue(), attention=True))
    assert result.segments == [] and result.attention is not None and result.words
    samples = audio_files.decode(out.getvalue(), audio_files.probe(out.getvalue()))
    alone = engine._engine.generate(dataclasses.replace(
        request(out.getvalue(), attention=True), audio=AudioInput(samples=samples, sample_rate_hz=RATE)), WAIT)
    assert (result.text, result.words) == (alone.text, alone.words)


def test_clips_within_the_window_are_the_engines_own(served, engine, spoken):
    short = wav_bytes(read_wav(spoken[0]).samples()[: 5 * RATE], RATE)
    result = served.generate(request(short))
    assert result.segments == [] and result.source_tokens  # the ordinary path: one request, its columns
    alone = engine._engine.generate(request(short), WAIT)
    assert (result.text, result.words, result.source_tokens) == (alone.text, alone.words, alone.source_tokens)


def test_transcribe_writes_subtitles_with_a_progress_bar(server, unary, spoken, tmp_path, capsys):
    from attnserve.clients import cli, subtitles

    audio = tmp_path / "lecture.wav"
    audio.write_bytes(spoken[0])
    srt, vtt = tmp_path / "out.srt", tmp_path / "out.vtt"
    status = cli.main(["transcribe", str(audio), "--address", server.address, "--beam-size", "1", "--srt", str(srt),
                       "--vtt", str(vtt), "--progress"])
    out, err = capsys.readouterr()
    assert status == 0 and out.strip() == unary.text
    count = len(unary.segments)
    assert f"] {count}/{count} segments" in err and err.count("\r") == count
    assert srt.read_text() == subtitles.srt(subtitles.result_cues(unary))
    assert vtt.read_text().startswith("WEBVTT\n\n00:00:0")
    first = srt.read_text().split("\n\n")[0].splitlines()
    assert first[0] == "1" and " --> " in first[1] and " ".join(first[2:]) in unary.segments[0].text


def _never(*args):
    raise AssertionError("decoded a file its header should have refused")


class _Counting:
    """An engine that counts the requests submitted to it."""

    def __init__(self, inner):
        self._inner, self.submitted = inner, 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def submit(self, request, on_token=None):
        self.submitted += 1
        return self._inner.submit(request, on_token)


def test_the_page_gets_each_segment_then_the_subtitles(server, unary, spoken):
    pytest.importorskip("aiohttp")
    from gateway_thread import BackgroundGateway

    with BackgroundGateway(server.address) as page:
        lines = _post_lines(f"{page.url}/api/transcribe?model={NAME}&beam_size=1", spoken[0])
    segments, last = [line["segment"] for line in lines[:-1]], lines[-1]
    assert sorted(s["index"] for s in segments) == list(range(len(unary.segments)))
    assert last["result"]["text"] == unary.text and last["srt"].startswith("1\n00:00:0")
    assert last["vtt"].startswith("WEBVTT\n\n")


def test_the_pages_hotwords_go_with_every_segment(server, served, unary, spoken):
    pytest.importorskip("aiohttp")
    import urllib.parse

    from gateway_thread import BackgroundGateway

    missed = sorted({w for s in SENTENCES for w in s.split()} - set(unary.text.split()))
    expected = served.generate(request(spoken[0], dataclasses.replace(GREEDY, hotwords=tuple(missed))))
    assert missed and expected.text != unary.text  # the hotwords change what is heard
    query = urllib.parse.urlencode({"model": NAME, "beam_size": 1, "hotwords": " ".join(missed)})
    with BackgroundGateway(server.address) as page:
        lines = _post_lines(f"{page.url}/api/transcribe?{query}", spoken[0])
    assert lines[-1]["result"]["text"] == expected.text


def test_the_page_is_served_over_https_with_a_certificate(server, tmp_path):
    pytest.importorskip("aiohttp")
    import asyncio
    import shutil
    import ssl
    import subprocess
    import urllib.request

    from aiohttp import web

    from attnserve.clients.web import gateway
    from attnserve.clients.web.http_options import HttpOptions

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "page.crt", tmp_path / "page.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(gateway.make_app(server.address))
    loop.run_until_complete(runner.setup())
    page_tls = HttpOptions(tls_cert=str(cert), tls_key=str(key)).ssl_context()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=page_tls)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        trusted = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/", timeout=WAIT, context=trusted) as response:
            assert response.status == 200 and b"long-file" in response.read()
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(WAIT)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    with pytest.raises(ValueError, match="--http-tls-cert .*page.key / --http-tls-key"):
        HttpOptions(tls_cert=str(key), tls_key=str(key)).ssl_context()


def _post_lines(url: str, body: bytes) -> list[dict]:
    import json
    import urllib.request

    request = urllib.request.Request(url, data=body, headers={"Content-Type": "audio/wav"})
    with urllib.request.urlopen(request, timeout=WAIT) as response:
        assert response.headers.get_content_type() == "application/x-ndjson"
        return [json.loads(line) for line in response.read().decode().splitlines() if line.strip()]


def test_engines_in_child_processes_cut_long_recordings_as_in_process(tiny_speech_repo):
    """--engine-process: the wrapper sits in the gRPC process over the child's engine, with the same answer."""
    from conftest import TINY_SPEECH_NAME

    rate, parts = 16000, []
    for i in range(3):  # 1.2 s chirps between pauses: 6 s, over the tiny model's 3-s window
        t = np.arange(round(1.2 * rate)) / rate
        parts += [np.zeros(round(0.8 * rate)), 0.3 * np.sin(2 * np.pi * (300 + 200 * i + 600 * t) * t)]
    wav = wav_bytes(np.concatenate(parts + [np.zeros(rate // 2)]), rate)
    asked = dataclasses.replace(audio_request(wav, model=TINY_SPEECH_NAME), decoding=GREEDY)
    answers = []
    for in_process in (True, False):
        options = app.ServeOptions(models=str(tiny_speech_repo), engine_process=not in_process,
                                   max_long_form_recordings=3, max_long_form_recordings_per_client=3)
        engines, _ = app.load_models(options)
        try:
            assert isinstance(engines[TINY_SPEECH_NAME], LongFormEngine)
            bounds = engines[TINY_SPEECH_NAME].options
            assert (bounds.max_recordings, bounds.max_recordings_per_client) == (3, 3)  # the flags reach it
            answers.append(engines[TINY_SPEECH_NAME].generate(asked, WAIT))
        finally:
            for engine in engines.values():
                engine.close()
    assert len(answers[0].segments) == 3 and answers[0].segments == answers[1].segments


def test_long_recordings_past_max_recordings_are_refused_until_one_ends(engine, spoken):
    bounded = LongFormEngine(engine._engine, dataclasses.replace(engine.options, max_recordings=1,
                                                                 max_recordings_per_client=1))
    try:
        first = bounded.submit(request(spoken[0]))
        busy = r"transcribing 1 long recordings.*--max-long-form-recordings"
        with pytest.raises(OverloadedError, match=busy) as refused:
            bounded.submit(request(spoken[0]))
        assert refused.value.reason == "long_form_recordings"
        short = bounded.submit(request(wav_bytes(read_wav(spoken[0]).samples()[: 3 * RATE], RATE)))
        assert short.result(WAIT).text is not None  # within the window: not a long recording
        first.result(WAIT)
        assert bounded.submit(request(spoken[0])).result(WAIT).text == first.result().text
    finally:
        bounded._pool.shutdown(wait=True)  # the engine inside is the module's, closed by its fixture


class _Held:
    """An engine that holds the requests submitted to it, unanswered, until `release()`, and from then on passes
    them to the real one: long recordings on it stay in progress for as long as a test needs."""

    def __init__(self, inner):
        self._inner, self._held, self._ours, self._released = inner, [], set(), False
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def submit(self, request, on_token=None):  # no **keywords: a client key passed on would fail here
        with self._lock:
            if not self._released:
                future = Future()
                self._held.append((request, future))
                self._ours.add(future)
                return future
        return self._inner.submit(request, on_token)

    def cancel(self, future):
        if future in self._ours:
            future.cancel()
        else:
            self._inner.cancel(future)

    def release(self):
        with self._lock:
            held, self._held, self._released = self._held, [], True
        for request, future in held:
            if not future.cancelled():
                self._inner.submit(request).add_done_callback(functools.partial(_copy, future))

    def close(self, *args, **keywords):
        pass  # the real engine is the module's, closed by its fixture


def _copy(target: Future, source: Future) -> None:
    if target.cancelled():
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())
    else:
        target.set_result(source.result())


def _held(engine, **bounds) -> tuple[_Held, LongFormEngine]:
    held = _Held(engine._engine)
    return held, LongFormEngine(held, dataclasses.replace(engine.options, **bounds))


PER_CLIENT = (r"this client is already transcribing {} long recordings on model 'speech-en', its most at once "
              r"\(--max-long-form-recordings-per-client\); retry later")
PER_MODEL = r"model 'speech-en' is transcribing {} long recordings, its most at once \(--max-long-form-recordings\)"


def test_one_client_at_its_bound_is_refused_while_another_is_still_admitted(engine, spoken):
    _, bounded = _held(engine, max_recordings=4, max_recordings_per_client=2)
    try:
        mine = [bounded.submit(request(spoken[0]), client="ip:10.0.0.1") for _ in range(2)]
        with pytest.raises(OverloadedError, match=PER_CLIENT.format(2)) as refused:
            bounded.submit(request(spoken[0]), client="ip:10.0.0.1")
        assert refused.value.reason == "long_form_recordings_per_client"
        theirs = bounded.submit(request(spoken[0]), client="ip:10.0.0.2")
        assert not theirs.done() and all(not f.done() for f in mine) and len(bounded._jobs) == 3
    finally:
        bounded.close()


def test_a_clients_slot_comes_back_when_its_recording_is_cancelled_fails_or_finishes(engine, spoken):
    held, bounded = _held(engine, max_recordings=4, max_recordings_per_client=1)
    client = "token:0123456789abcdef"
    try:
        first = bounded.submit(request(spoken[0]), client=client)
        with pytest.raises(OverloadedError, match=PER_CLIENT.format(1)):
            bounded.submit(request(spoken[0]), client=client)
        bounded.cancel(first)  # cancelled: its slot comes back
        with pytest.raises(ValueError, match="cannot read the MP3 file"):
            bounded.submit(request(b"ID3" + bytes(5000)), client=client)  # fails while decoding: so does its slot
        import soundfile

        out = io.BytesIO()
        soundfile.write(out, read_wav(spoken[0]).samples()[: 4 * RATE], RATE, format="FLAC")
        bounded.cancel(bounded.submit(request(out.getvalue()), client=client))  # within the window: no recording
        second = bounded.submit(request(spoken[0]), client=client)
        with pytest.raises(OverloadedError, match=PER_CLIENT.format(1)):
            bounded.submit(request(spoken[0]), client=client)
        held.release()
        assert second.result(WAIT).segments
        _wait_until(lambda: not bounded._clients)  # finished: its slot comes back (just after its result is set)
        third = bounded.submit(request(spoken[0]), client=client)
        bounded.cancel(third)
        assert bounded._clients == {} and bounded._jobs == {}
    finally:
        bounded.close()


def test_requests_that_name_no_client_are_bound_per_model_only(engine, spoken):
    _, bounded = _held(engine, max_recordings=2, max_recordings_per_client=1)
    try:
        anonymous = [bounded.submit(request(spoken[0])) for _ in range(2)]  # more than one client's bound
        with pytest.raises(OverloadedError, match=PER_MODEL.format(2)) as refused:
            bounded.submit(request(spoken[0]))
        assert refused.value.reason == "long_form_recordings"
        with pytest.raises(OverloadedError) as refused:  # the model is full for a client with no recording too
            bounded.submit(request(spoken[0]), client="ip:10.0.0.1")
        assert refused.value.reason == "long_form_recordings" and bounded._clients == {}
        bounded.cancel(anonymous[0])
        bounded.cancel(bounded.submit(request(spoken[0])))
    finally:
        bounded.close()


def _wait_until(condition) -> None:
    for _ in range(400):
        if condition():
            return
        threading.Event().wait(0.05)
    raise AssertionError("timed out")


def _refusals(reason: str) -> float:
    from prometheus_client import REGISTRY

    labels = {"model": NAME, "code": "RESOURCE_EXHAUSTED", "reason": reason}
    return REGISTRY.get_sample_value("attnserve_rejected_requests_total", labels) or 0.0


def test_the_server_keys_clients_by_address_and_refuses_a_third_long_recording_from_one(engine, spoken):
    _, bounded = _held(engine)  # the server's defaults: 4 per model, 2 per client
    proto = convert.request_to_proto(request(spoken[0]))
    with app.BackgroundServer({NAME: bounded}) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        calls = [stub.Generate.future(proto), stub.Generate.future(proto)]
        _wait_until(lambda: len(bounded._jobs) == 2)
        assert bounded._clients == {"ip:127.0.0.1": 2}  # the peer's address, without its port
        before = _refusals("long_form_recordings_per_client")
        with pytest.raises(grpc.RpcError) as refused:
            stub.Generate(proto, timeout=WAIT)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.details().startswith("this client is already transcribing 2 long recordings")
        assert _refusals("long_form_recordings_per_client") == before + 1
        calls[0].cancel()  # the call's recording is cancelled on the server: its slot comes back
        _wait_until(lambda: bounded._clients == {"ip:127.0.0.1": 1})
        calls.append(stub.Generate.future(proto))
        _wait_until(lambda: len(bounded._jobs) == 2)
        for call in calls:
            call.cancel()
        _wait_until(lambda: not bounded._jobs)
    assert bounded._clients == {}


def test_with_tokens_the_server_keys_clients_by_a_hash_of_their_token(engine, spoken):
    _, bounded = _held(engine, max_recordings_per_client=1)
    proto = convert.request_to_proto(request(spoken[0]))
    alpha, beta = [[("authorization", f"Bearer {token}")] for token in ("alpha-secret", "beta-secret")]
    tokens = frozenset({"alpha-secret", "beta-secret"})
    with (app.BackgroundServer({NAME: bounded}, tokens=tokens) as server,
          grpc.insecure_channel(server.address) as channel):
        stub = pb_grpc.AttnServeStub(channel)
        calls = [stub.Generate.future(proto, metadata=alpha)]
        _wait_until(lambda: len(bounded._jobs) == 1)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Generate(proto, timeout=WAIT, metadata=alpha)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-long-form-recordings-per-client" in refused.value.details()
        calls.append(stub.Generate.future(proto, metadata=beta))  # the same address, another client
        _wait_until(lambda: len(bounded._jobs) == 2)
        keys = {"token:" + hashlib.sha256(token.encode()).hexdigest()[:16]: 1 for token in sorted(tokens)}
        assert bounded._clients == keys and not any("secret" in key for key in bounded._clients)
        for call in calls:
            call.cancel()
        _wait_until(lambda: not bounded._jobs)
