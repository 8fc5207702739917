"""Python clients of the attnserve gRPC API: `Client` (blocking) and `AsyncClient` (asyncio).

Both return the plain dataclasses of `attnserve.server.generation` (converted by `attnserve.server.convert`,
the same code the server uses) and raise `AttnServeError` for any failed RPC. Neither imports the
serving core, so a client install needs no ONNX Runtime.

Example:
    with Client("localhost:50051") as client:
        result = client.translate("我愛你", to="en", attention=True)
        print(result.text, result.attention.col_labels)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator

import grpc
import numpy as np

from attnserve.server import convert
from attnserve.server.generation import (
    AttentionGranularity,
    AttentionOptions,
    AudioInput,
    DecodingOptions,
    GenerationRequest,
    GenerationResult,
    ModelInfo,
    StreamedToken,
)
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc

DEFAULT_ADDRESS = f"localhost:{convert.DEFAULT_PORT}"
DEFAULT_MODEL = "translate-zh-en"
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", convert.MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", convert.MAX_MESSAGE_BYTES),
]


class AttnServeError(Exception):
    """A failed RPC: `code` is the grpc.StatusCode, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


@contextlib.contextmanager
def _rpc_errors() -> Iterator[None]:
    # Both grpc.RpcError (sync) and grpc.aio.AioRpcError (async) expose code() and details().
    try:
        yield
    except grpc.RpcError as exc:
        raise AttnServeError(exc.code(), exc.details() or "") from None


def translation_request(
    text: str,
    to: str = "",
    attention: bool = False,
    granularity: str = "words",
    layer: int | None = None,
    max_new_tokens: int = 0,
    model: str = DEFAULT_MODEL,
    beam_size: int = 1,
    request_id: str = "",
) -> GenerationRequest:
    """Builds the request `translate` sends; pass it to `stream` to watch the tokens arrive.

    Args:
        text: source text.
        to: target language code, e.g. "en" or "zh-TW"; "" = the model's first target language.
        attention: whether to return the attention matrix.
        granularity: "words" or "pieces".
        layer: decoder layer to read; negative counts from the last; None = the model's default layer.
        max_new_tokens: upper bound on generated tokens; 0 = the model's limit.
        model: served model name.
        beam_size: 1 = greedy search.
        request_id: echoed in server logs.

    Raises:
        ValueError: unknown granularity.
    """
    return GenerationRequest(
        model=model,
        text=text,
        target_language=to,
        decoding=DecodingOptions(max_new_tokens=max_new_tokens, beam_size=beam_size),
        attention=AttentionOptions(enabled=attention, layer=layer, granularity=AttentionGranularity(granularity)),
        request_id=request_id,
    )


def audio_request(audio: bytes | np.ndarray, sample_rate_hz: int = 0, *, model: str, **options) -> GenerationRequest:
    """Builds a request for an audio model (speech recognition or translation).

    Args:
        audio: a WAV file's bytes, or (N,) mono float samples in [-1, 1].
        sample_rate_hz: the rate of raw samples (required with them); 0 for a WAV file.
        model: served model name (see `list_models`: its `input_kind` is audio, its limits are in `audio`).
        options: `translation_request`'s options (to, attention, granularity, layer, max_new_tokens, ...).
    """
    if isinstance(audio, (bytes, bytearray)):
        data = AudioInput(wav=bytes(audio), sample_rate_hz=sample_rate_hz)
    else:
        data = AudioInput(samples=np.asarray(audio, dtype=np.float32).reshape(-1), sample_rate_hz=sample_rate_hz)
    return dataclasses.replace(translation_request("", model=model, **options), audio=data)


class Client:
    """Blocking client.

    Args:
        address: "host:port" of the server.
        timeout: deadline of every call in seconds; None = no deadline.
    """

    def __init__(self, address: str = DEFAULT_ADDRESS, timeout: float | None = None):
        self.address = address
        self._channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._stub = pb_grpc.AttnServeStub(self._channel)
        self.timeout = timeout

    def translate(self, text: str, to: str = "", **options) -> GenerationResult:
        """Translates `text` into `to`; `options` are `translation_request`'s (attention, beam_size, ...)."""
        request = translation_request(text, to, **options)
        return self.generate(request)

    def generate(self, request: GenerationRequest, source_language: str | None = None) -> GenerationResult:
        """Runs one request to completion."""
        with _rpc_errors():
            response = self._stub.Generate(convert.request_to_proto(request, source_language), timeout=self.timeout)
        return convert.result_from_proto(response)

    def stream(
        self, request: GenerationRequest, source_language: str | None = None
    ) -> Iterator[StreamedToken | GenerationResult]:
        """Yields a `StreamedToken` per generated token, then the `GenerationResult`.

        A token carries its attention row (one weight per source piece, EOS included) when the request
        asked for attention, at either granularity; the final result has the whole matrix. Leaving the
        loop early cancels the request on the server, which stops decoding it.
        """
        call = self._stub.GenerateStream(convert.request_to_proto(request, source_language), timeout=self.timeout)
        try:
            with _rpc_errors():
                for message in call:
                    yield convert.stream_event_from_proto(message)
        finally:
            call.cancel()  # no-op once the stream has ended

    def list_models(self) -> list[ModelInfo]:
        with _rpc_errors():
            response = self._stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout)
        return [convert.model_info_from_proto(m) for m in response.models]

    def get_model(self, name: str) -> ModelInfo:
        with _rpc_errors():
            response = self._stub.GetModel(pb.GetModelRequest(name=name), timeout=self.timeout)
        return convert.model_info_from_proto(response)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class AsyncClient:
    """asyncio client; the same methods as `Client`, as coroutines (`stream` is an async iterator).

    Args:
        address: "host:port" of the server.
        timeout: deadline of every call in seconds; None = no deadline.
    """

    def __init__(self, address: str = DEFAULT_ADDRESS, timeout: float | None = None):
        self._channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._stub = pb_grpc.AttnServeStub(self._channel)
        self.timeout = timeout

    async def translate(self, text: str, to: str = "", **options) -> GenerationResult:
        """Translates `text` into `to`; `options` are `translation_request`'s (attention, beam_size, ...)."""
        request = translation_request(text, to, **options)
        return await self.generate(request)

    async def generate(self, request: GenerationRequest, source_language: str | None = None) -> GenerationResult:
        """Runs one request to completion."""
        with _rpc_errors():
            response = await self._stub.Generate(
                convert.request_to_proto(request, source_language), timeout=self.timeout
            )
        return convert.result_from_proto(response)

    async def stream(
        self, request: GenerationRequest, source_language: str | None = None
    ) -> AsyncIterator[StreamedToken | GenerationResult]:
        """Yields a `StreamedToken` per generated token, then the `GenerationResult` (see `Client.stream`)."""
        call = self._stub.GenerateStream(convert.request_to_proto(request, source_language), timeout=self.timeout)
        try:
            with _rpc_errors():
                async for message in call:
                    yield convert.stream_event_from_proto(message)
        finally:
            call.cancel()

    async def list_models(self) -> list[ModelInfo]:
        with _rpc_errors():
            response = await self._stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout)
        return [convert.model_info_from_proto(m) for m in response.models]

    async def get_model(self, name: str) -> ModelInfo:
        with _rpc_errors():
            response = await self._stub.GetModel(pb.GetModelRequest(name=name), timeout=self.timeout)
        return convert.model_info_from_proto(response)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()
