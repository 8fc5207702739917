"""Python clients of the attnserve gRPC API: `Client` (blocking) and `AsyncClient` (asyncio).

Both return the plain dataclasses of `attnserve.api.generation` (converted by `attnserve.api.convert`,
the same code the server uses) and raise a subclass of `AttnServeError` for each failed RPC, by status code
(`clients/errors.py`). Each call has a deadline (`timeout`, covering its retries), is retried with backoff
when the server is unavailable or overloaded (`clients/retry.py`), and goes to the next of the client's
addresses in turn (`clients/connection.py`). Neither client imports the serving core, so a client install
needs no ONNX Runtime: the client distribution (clients/standalone/) needs only grpcio and protobuf.

Example:
    with Client("localhost:50051") as client:
        result = client.translate("我愛你", to="en", attention=True)
        print(result.text, result.attention.col_labels)

    # Two replicas, TLS with a private CA, a bearer token, 10 s per call:
    Client(["10.0.0.5:50051", "10.0.0.6:50051"], timeout=10, tls=TlsOptions("ca.pem"), token=token)
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING

import grpc
from attnserve.clients import errors
from attnserve.clients.connection import ChannelPool, TlsOptions, call_metadata, split_addresses
from attnserve.clients.errors import AttnServeError
from attnserve.clients.retry import RetryPolicy
from attnserve.api import convert
from attnserve.api.generation import (
    AttentionGranularity,
    AttentionOptions,
    AttentionReduction,
    AudioInput,
    DecodingOptions,
    GenerationRequest,
    GenerationResult,
    ImageInput,
    ModelInfo,
    SamplingOptions,
    StreamedToken,
    TranscriptSegment,
    VideoInput,
)
from attnserve.v1 import attnserve_pb2 as pb
from google.protobuf import wrappers_pb2

if TYPE_CHECKING:  # raw audio samples: whoever passes an array has numpy; the client itself needs none
    import numpy as np

__all__ = [
    "AsyncClient",
    "AttnServeError",
    "Client",
    "RetryPolicy",
    "TlsOptions",
    "audio_request",
    "image_request",
    "translation_request",
    "video_request",
]

DEFAULT_ADDRESS = f"localhost:{convert.DEFAULT_PORT}"
DEFAULT_MODEL = "translate-zh-en"
DEFAULT_RETRY = RetryPolicy()

# The standard health service, called without grpcio-health-checking's stubs (one dependency fewer for a
# client install): its request {string service = 1} and response {ServingStatus status = 1} have the wire
# form of protobuf's StringValue and Int32Value; the names are grpc/health/v1/health.proto's ServingStatus.
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_SERVING_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def translation_request(
    text: str,
    to: str = "",
    attention: bool = False,
    granularity: str | None = None,
    layer: int | None = None,
    max_new_tokens: int | None = None,
    model: str = DEFAULT_MODEL,
    beam_size: int | None = None,
    request_id: str = "",
    num_return_sequences: int | None = None,
    sampling: SamplingOptions | None = None,
    heads: Sequence[int] = (),
    reduction: str | None = None,
    reverse_weight: float | None = None,
) -> GenerationRequest:
    """Builds the request `translate` sends; pass it to `stream` to watch the tokens arrive.

    Every option left None takes the default of `DecodingOptions` / `AttentionOptions` (the request
    contract, protos/attnserve/api/generation.py), so a client states only what it changes.

    Args:
        text: source text.
        to: target language code, e.g. "en" or "zh-TW"; "" = the server's choice (the language the text is not in).
        attention: whether to return the attention matrix.
        granularity: "words" or "pieces"; None = pieces (AttentionOptions' default).
        layer: decoder layer to read; negative counts from the last; None = the model's default layer.
        max_new_tokens: upper bound on generated tokens; None (or 0) = the model's limit.
        model: served model name.
        beam_size: 1 = greedy search, more = beam search; None (or 0) = the model's default
            (ModelInfo.default_beam_size).
        request_id: echoed in server logs.
        num_return_sequences: > 1 = also list that many best sequences with their scores (<= beam_size);
            None = 1.
        sampling: sample instead of searching (beam_size 1); None = search.
        heads: heads of the attention layer to combine (negative counts from the last); empty = all.
        reduction: "mean" (rows sum to 1) or "max" (what any one of the heads looked at); None = mean.
        reverse_weight: > 0 = rerank the beam's candidates by how well each translates back into the source
            (DecodingOptions.reverse_weight; not with `stream`); None (or 0) = off.

    Raises:
        ValueError: unknown granularity or reduction.
    """
    decoding = _given(max_new_tokens=max_new_tokens, beam_size=beam_size, num_return_sequences=num_return_sequences,
                      sampling=sampling, reverse_weight=reverse_weight)
    attention_options = _given(
        layer=layer, heads=tuple(heads),
        granularity=None if granularity is None else AttentionGranularity(granularity),
        reduction=None if reduction is None else AttentionReduction(reduction),
    )
    return GenerationRequest(
        model=model,
        text=text,
        target_language=to,
        decoding=DecodingOptions(**decoding),
        attention=AttentionOptions(enabled=attention, **attention_options),
        request_id=request_id,
    )


def _given(**options) -> dict:
    """The options that are set (not None): the rest keep their dataclass defaults."""
    return {name: value for name, value in options.items() if value is not None}


def audio_request(audio: bytes | np.ndarray, sample_rate_hz: int = 0, *, model: str, hotwords: Sequence[str] = (),
                  hotword_boost: float = 0.0, **options) -> GenerationRequest:
    """Builds a request for an audio model (speech recognition or translation).

    Args:
        audio: a WAV file's bytes, or (N,) mono float samples in [-1, 1].
        sample_rate_hz: the rate of raw samples (required with them); 0 for a WAV file.
        model: served model name (see `list_models`: its `input_kind` is audio, its limits are in `audio`).
        hotwords: names and terms the recording holds, which the search favours (DecodingOptions.hotwords);
            hotword_boost: their bonus per letter, 0 = the server's default.
        options: `translation_request`'s options (to, attention, granularity, layer, max_new_tokens, ...).
    """
    if isinstance(audio, (bytes, bytearray)):
        data = AudioInput(wav=bytes(audio), sample_rate_hz=sample_rate_hz)
    else:
        import numpy as np  # raw samples: an array or a list of floats, which needs numpy here

        data = AudioInput(samples=np.asarray(audio, dtype=np.float32).reshape(-1), sample_rate_hz=sample_rate_hz)
    request = translation_request("", model=model, **options)
    decoding = dataclasses.replace(request.decoding, hotwords=tuple(hotwords), hotword_boost=hotword_boost)
    return dataclasses.replace(request, audio=data, decoding=decoding)


def image_request(image: bytes, *, model: str, **options) -> GenerationRequest:
    """Builds a request for an image model (captioning): `image` is a PNG or JPEG file's bytes.

    Args:
        image: the encoded image.
        model: served model name (its `input_kind` is image, its limits are in `image`).
        options: `translation_request`'s options (to, attention, granularity, layer, max_new_tokens, ...).
    """
    return dataclasses.replace(translation_request("", model=model, **options), image=ImageInput(bytes(image)))


def video_request(video: bytes | Sequence[bytes], *, model: str, frames_per_second: float = 0.0,
                  **options) -> GenerationRequest:
    """Builds a request for a video model (clip captioning).

    Args:
        video: a video file's bytes (MP4, WebM or GIF), or a list of PNG/JPEG stills, one per frame.
        model: served model name (its `input_kind` is video, its limits are in `video`).
        frames_per_second: the rate of the stills (required with them).
        options: `translation_request`'s options (attention, granularity, max_new_tokens, ...).
    """
    clip = (VideoInput(bytes(video)) if isinstance(video, (bytes, bytearray))
            else VideoInput(frames=tuple(bytes(f) for f in video), frames_per_second=frames_per_second))
    return dataclasses.replace(translation_request("", model=model, **options), video=clip)


class _Settings:
    """What both clients share: addresses, deadline, retries and credentials.

    Args:
        address: "host:port", several joined by commas, or a list of them: calls go to each in turn.
        timeout: deadline of every call in seconds, retries included; None = no deadline.
        tls: TLS settings (True = TLS with the system's root certificates); None or False = plaintext.
        token: bearer token sent as `authorization: Bearer <token>`; None = none.
        retry: when and how failed calls are retried (UNAVAILABLE and RESOURCE_EXHAUSTED only).
    """

    def __init__(
        self,
        address: str | Sequence[str],
        timeout: float | None,
        tls: TlsOptions | bool | None,
        token: str | None,
        retry: RetryPolicy,
    ):
        self.addresses = split_addresses(address)
        self.address = address if isinstance(address, str) else ",".join(self.addresses)
        self.timeout = timeout
        self.tls = TlsOptions() if tls is True else (tls or None)
        self.retry = retry
        self._metadata = call_metadata(token)

    def _deadline(self) -> float | None:
        return None if self.timeout is None else time.monotonic() + self.timeout

    @staticmethod
    def _remaining(deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def _retry_delay(self, failed: int, error: AttnServeError, deadline: float | None) -> float:
        """Seconds to wait before the next try; raises `error` when there is none."""
        delay = self.retry.delay(failed, error.code, self._remaining(deadline))
        if delay is None:
            raise error from None
        return delay


class Client(_Settings):
    """Blocking client; safe to share between threads. See `_Settings` for the arguments."""

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        timeout: float | None = None,
        *,
        tls: TlsOptions | bool | None = None,
        token: str | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
    ):
        super().__init__(address, timeout, tls, token, retry)
        self._pool = ChannelPool(self.addresses, self.tls)

    def translate(self, text: str, to: str = "", **options) -> GenerationResult:
        """Translates `text` into `to`; `options` are `translation_request`'s (attention, beam_size, ...)."""
        request = translation_request(text, to, **options)
        return self.generate(request)

    def generate(self, request: GenerationRequest, source_language: str | None = None) -> GenerationResult:
        """Runs one request to completion."""
        message = convert.request_to_proto(request, source_language)
        return convert.result_from_proto(self._unary("Generate", message))

    def stream(
        self, request: GenerationRequest, source_language: str | None = None, stream_interval: int = 0
    ) -> Iterator[StreamedToken | TranscriptSegment | GenerationResult]:
        """Yields a `StreamedToken` per generated token, then the `GenerationResult`. Audio longer than the
        model's window (long-form) yields a `TranscriptSegment` per segment instead, as each is transcribed.

        A token carries its attention row (one weight per source piece, EOS included) when the request
        asked for attention, at either granularity; the final result has the whole matrix. Leaving the
        loop early cancels the request on the server, which stops decoding it. A stream that fails before
        its first message is retried as a unary call would be; once a token arrived, a failure is raised.

        Args:
            stream_interval: after the first token, have the server send the tokens this many at a time (one
                message each: less work per token on both sides under load, tokens a little later); they are
                still yielded one by one. 0 or 1 = one message per token.
        """
        message = convert.request_to_proto(request, source_language)
        message.stream_interval = stream_interval
        deadline, failed = self._deadline(), 0
        while True:
            call = self._pool.next().stub.GenerateStream(
                message, timeout=self._remaining(deadline), metadata=self._metadata
            )
            received = False
            try:
                for event in call:
                    received = True
                    yield from _flattened(convert.stream_events_from_proto(event))
                return
            except grpc.RpcError as exc:
                error = errors.from_rpc_error(exc)
                if received:
                    raise error from None
                failed += 1
                delay = self._retry_delay(failed, error, deadline)
            finally:
                call.cancel()  # no-op once the stream has ended
            time.sleep(delay)

    def list_models(self) -> list[ModelInfo]:
        response = self._unary("ListModels", pb.ListModelsRequest())
        return [convert.model_info_from_proto(m) for m in response.models]

    def get_model(self, name: str) -> ModelInfo:
        return convert.model_info_from_proto(self._unary("GetModel", pb.GetModelRequest(name=name)))

    def health(self, service: str = "") -> dict[str, str]:
        """Asks every address's standard health service, without retries (a probe wants the truth).

        Args:
            service: "" = the server as a whole; "attnserve.v1.AttnServe", or a model's name.

        Returns:
            address -> "SERVING" or "NOT_SERVING", or the status code of a failed check: "UNAVAILABLE" for a
            server that does not answer, "NOT_FOUND" for a service it does not know.
        """
        statuses = {}
        for endpoint in self._pool.endpoints:
            check = endpoint.channel.unary_unary(
                _HEALTH_CHECK,
                request_serializer=wrappers_pb2.StringValue.SerializeToString,
                response_deserializer=wrappers_pb2.Int32Value.FromString,
            )
            try:
                response = check(wrappers_pb2.StringValue(value=service), timeout=self.timeout)
                statuses[endpoint.address] = _SERVING_STATUS.get(response.value, "UNKNOWN")
            except grpc.RpcError as exc:
                statuses[endpoint.address] = exc.code().name
        return statuses

    def _unary(self, method: str, message):
        """Calls `method` on the next address, retrying as the policy allows within the deadline."""
        deadline, failed = self._deadline(), 0
        while True:
            stub = self._pool.next().stub
            try:
                return getattr(stub, method)(message, timeout=self._remaining(deadline), metadata=self._metadata)
            except grpc.RpcError as exc:
                failed += 1
                delay = self._retry_delay(failed, errors.from_rpc_error(exc), deadline)
            time.sleep(delay)

    def close(self) -> None:
        for endpoint in self._pool.endpoints:
            endpoint.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class AsyncClient(_Settings):
    """asyncio client: `Client`'s methods as coroutines (`stream` is an async iterator), the same arguments."""

    def __init__(
        self,
        address: str | Sequence[str] = DEFAULT_ADDRESS,
        timeout: float | None = None,
        *,
        tls: TlsOptions | bool | None = None,
        token: str | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
    ):
        super().__init__(address, timeout, tls, token, retry)
        self._pool = ChannelPool(self.addresses, self.tls, aio=True)

    async def translate(self, text: str, to: str = "", **options) -> GenerationResult:
        """Translates `text` into `to`; `options` are `translation_request`'s (attention, beam_size, ...)."""
        request = translation_request(text, to, **options)
        return await self.generate(request)

    async def generate(self, request: GenerationRequest, source_language: str | None = None) -> GenerationResult:
        """Runs one request to completion."""
        message = convert.request_to_proto(request, source_language)
        return convert.result_from_proto(await self._unary("Generate", message))

    async def stream(
        self, request: GenerationRequest, source_language: str | None = None, stream_interval: int = 0
    ) -> AsyncIterator[StreamedToken | TranscriptSegment | GenerationResult]:
        """Yields a `StreamedToken` per generated token (or a long-form request's `TranscriptSegment`s), then
        the `GenerationResult` (see `Client.stream`)."""
        message = convert.request_to_proto(request, source_language)
        message.stream_interval = stream_interval
        deadline, failed = self._deadline(), 0
        while True:
            call = self._pool.next().stub.GenerateStream(
                message, timeout=self._remaining(deadline), metadata=self._metadata
            )
            received = False
            try:
                async for event in call:
                    received = True
                    for item in _flattened(convert.stream_events_from_proto(event)):
                        yield item
                return
            except grpc.RpcError as exc:
                error = errors.from_rpc_error(exc)
                if received:
                    raise error from None
                failed += 1
                delay = self._retry_delay(failed, error, deadline)
            finally:
                call.cancel()
            await asyncio.sleep(delay)

    async def list_models(self) -> list[ModelInfo]:
        response = await self._unary("ListModels", pb.ListModelsRequest())
        return [convert.model_info_from_proto(m) for m in response.models]

    async def get_model(self, name: str) -> ModelInfo:
        return convert.model_info_from_proto(await self._unary("GetModel", pb.GetModelRequest(name=name)))

    async def _unary(self, method: str, message):
        """Calls `method` on the next address, retrying as the policy allows within the deadline."""
        deadline, failed = self._deadline(), 0
        while True:
            stub = self._pool.next().stub
            try:
                return await getattr(stub, method)(
                    message, timeout=self._remaining(deadline), metadata=self._metadata
                )
            except grpc.RpcError as exc:
                failed += 1
                delay = self._retry_delay(failed, errors.from_rpc_error(exc), deadline)
            await asyncio.sleep(delay)

    async def close(self) -> None:
        for endpoint in self._pool.endpoints:
            await endpoint.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()


def _flattened(
    converted: list[StreamedToken | TranscriptSegment] | GenerationResult,
) -> list[StreamedToken | TranscriptSegment | GenerationResult]:
    """A stream message's tokens (one, or a batch's), its segment, or its final result, as items to yield."""
    return converted if isinstance(converted, list) else [converted]
