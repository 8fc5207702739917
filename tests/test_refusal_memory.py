"""Memory of refused and large requests comes back: a served process (a text and a speech model, tokens
required) is sent rounds of concurrent large requests of every kind, and its RSS must return within 1.25x
of what it was after ordinary traffic.

The kinds: text far over the text model's limit (OUT_OF_RANGE before parsing, under gRPC's limit, which
the speech model sets), the same bytes without a token (UNAUTHENTICATED), WAVs over the speech model's
duration (OUT_OF_RANGE from the header) and WAVs it decodes and answers (OK). Before the fix each round
kept most of its payloads: exception -> traceback -> frame -> request bytes cycles waited for a full
garbage collection, and glibc kept the freed pages in its arenas.
"""

from __future__ import annotations

import concurrent.futures
import io
import shutil
import sys
import wave

import grpc
import numpy as np
import pytest

import tiny_speech
from attnserve.export.translation import bpe
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from served_process import WAIT, rss_mib, served

TOKEN = "s3cret"
CONCURRENT = 8
ROUNDS = 3
RATE = 384_000  # the highest rate the server resamples: many bytes for few seconds of audio


def _wav(seconds: float) -> bytes:
    samples = (np.sin(np.arange(int(seconds * RATE)) / 40) * 8000).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(samples.tobytes())
    return out.getvalue()




@pytest.fixture(scope="module")
def repository(tmp_path_factory, tiny_model_repo, tiny_speech_repo, tiny_tokenizer):
    """tiny-translate beside a tiny-speech that accepts 12 MB, 8 s WAVs (gRPC's limit is then ~13.5 MB)."""
    root = tmp_path_factory.mktemp("refusal_repo")
    shutil.copytree(tiny_model_repo / "tiny-translate", root / "tiny-translate")
    shutil.copytree(tiny_speech_repo / "tiny-speech", root / "tiny-speech")
    start = bpe.language_token_ids(tiny_tokenizer)["en"]
    manifest = tiny_speech.manifest("tiny-speech", start, max_seconds=8, max_bytes=12_000_000)
    tiny_speech.write_manifest(root / "tiny-speech" / "1", manifest)
    (root / "tokens").write_text(TOKEN + "\n")
    return root


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_rss_returns_after_rounds_of_large_refused_and_served_requests(repository):
    text = pb.GenerateRequest(model="tiny-translate", text=pb.TextInput(text="知" * (3 << 20)))  # 9 MiB
    long_wav = pb.GenerateRequest(model="tiny-speech", audio=pb.AudioInput(data=_wav(14)))  # 10.8 MB, 14 s
    legit_wav = pb.GenerateRequest(model="tiny-speech", audio=pb.AudioInput(data=_wav(6)))  # 4.6 MB, 6 s
    small = [pb.GenerateRequest(model="tiny-translate", text=pb.TextInput(text="hello")),
             pb.GenerateRequest(model="tiny-speech", audio=pb.AudioInput(data=_wav(0.5)))]
    auth = (("authorization", f"Bearer {TOKEN}"),)
    kinds = [  # (request, metadata, expected status)
        (text, auth, grpc.StatusCode.OUT_OF_RANGE),
        (long_wav, (), grpc.StatusCode.UNAUTHENTICATED),
        (long_wav, auth, grpc.StatusCode.OUT_OF_RANGE),
        (legit_wav, auth, grpc.StatusCode.OK),
    ]
    # Recordings over the model's window refused, not transcribed in segments (server/engine/longform.py).
    args = ["--auth-token-file", str(repository / "tokens"), "--long-form-max-minutes", "0"]
    options = [("grpc.max_send_message_length", 64 << 20)]
    with served([sys.executable, "-m", "attnserve.clients.cli"], str(repository), extra_args=args) as server, \
            grpc.insecure_channel(server.address, options=options) as channel, \
            concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
        generate = pb_grpc.AttnServeStub(channel).Generate

        def status(request, metadata) -> grpc.StatusCode:
            try:
                generate(request, metadata=metadata, timeout=4 * WAIT)
            except grpc.RpcError as error:
                return error.code()
            return grpc.StatusCode.OK

        # Warm every thread and buffer ordinary traffic uses, then measure.
        warm = list(pool.map(lambda i: status(small[i % 2], auth), range(4 * CONCURRENT)))
        assert set(warm) == {grpc.StatusCode.OK}
        before = rss_mib(server.process.pid)
        for _ in range(ROUNDS):
            for request, metadata, expected in kinds:
                codes = set(pool.map(lambda _: status(request, metadata), range(CONCURRENT)))
                assert codes == {expected}, (request.model, expected, codes)
        after = rss_mib(server.process.pid)
        assert status(small[0], auth) == grpc.StatusCode.OK
    print(f"RSS before {before:.0f} MiB, after {ROUNDS} rounds x {len(kinds)} kinds x {CONCURRENT}: {after:.0f} MiB")
    assert after <= 1.25 * before, f"RSS grew from {before:.0f} MiB to {after:.0f} MiB"
