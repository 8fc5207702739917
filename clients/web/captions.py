"""The gateway's long-recording route: a transcription streamed to the page segment by segment, then its
subtitles.

    POST /api/transcribe?model=M[&beam_size=B][&hotwords=W1+W2]
        body: the audio file (any format the server reads: ModelInfo.audio.formats)

answers newline-delimited JSON (application/x-ndjson), one object a line, as the server sends them:
`{"segment": {...}}` for each transcribed segment of a recording longer than the model's window (in the
order they finish: each names its index and count), then `{"result": {...}, "srt": "...", "vtt": "..."}`.
A failure before the first line is an ordinary error answer (errors.errors_middleware); one after it is a last line
`{"error": {"code": ..., "message": ...}}`. A page that goes away cancels the call, and the server stops
decoding the remaining segments.
"""

from __future__ import annotations

import dataclasses
import json

from aiohttp import web

from attnserve.clients import subtitles
from attnserve.clients.client import AttnServeError, audio_request
from attnserve.clients.web import payload
from attnserve.api.generation import GenerationResult, TranscriptSegment


async def transcribe(client_key: web.AppKey, request: web.Request) -> web.StreamResponse:
    model = request.query.get("model", "")
    if not model:
        raise web.HTTPBadRequest(reason="invalid argument", text="name a model: /api/transcribe?model=NAME")
    try:
        beam_size = int(request.query.get("beam_size", "0"))  # 0 = the model's default search
    except ValueError:
        raise web.HTTPBadRequest(reason="invalid argument", text="beam_size must be a whole number") from None
    hotwords = request.query.get("hotwords", "").split()  # DecodingOptions.hotwords; the server checks them
    call = request.app[client_key].stream(audio_request(await request.read(), model=model, beam_size=beam_size,
                                                        hotwords=hotwords))
    response = None
    try:
        async for event in call:
            if response is None:  # the first line: from now on errors are lines too
                response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
                await response.prepare(request)
            line = _line(event)
            if line is not None:
                await response.write((json.dumps(line, ensure_ascii=False) + "\n").encode())
    except AttnServeError as exc:
        if response is None:
            raise
        await response.write((json.dumps(payload.error_json(exc.code.name, exc.details)) + "\n").encode())
    if response is None:
        raise RuntimeError("the stream ended without a message")
    await response.write_eof()
    return response


def _line(event) -> dict | None:
    """A stream event as its line; None for the token events of a clip within the window (only its result
    is shown)."""
    if isinstance(event, TranscriptSegment):
        return {"segment": payload.plain(dataclasses.asdict(event))}
    if isinstance(event, GenerationResult):
        cues = subtitles.result_cues(event)
        return {"result": payload.result_json(event), "srt": subtitles.srt(cues), "vtt": subtitles.vtt(cues)}
    return None
