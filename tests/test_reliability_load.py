"""Load: 64 concurrent clients mixing options (beam sizes, attention, granularity, languages, stream or
unary) get no errors and no crossed answers: every response equals what the same request gets alone.

Bounded by a request count, not a duration; bench/soak.py runs the same mix for as long as asked.
"""

from __future__ import annotations

import concurrent.futures
import itertools

import grpc
import numpy as np

from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from fakes import MIXED_TEXTS, WAIT

CLIENTS = 64
REQUESTS_PER_CLIENT = 4


def mixed_requests(model: str) -> list[pb.GenerateRequest]:
    """Distinct requests: every text with a rotating choice of options."""
    options = itertools.cycle(
        [
            dict(decoding=pb.DecodingOptions(beam_size=1, max_new_tokens=12)),
            dict(decoding=pb.DecodingOptions(beam_size=3, max_new_tokens=8), target_language="en"),
            dict(attention=pb.AttentionOptions(mode=pb.ATTENTION_MODE_AGGREGATED), target_language="zh-TW"),
            dict(
                decoding=pb.DecodingOptions(beam_size=2, max_new_tokens=10),
                attention=pb.AttentionOptions(
                    mode=pb.ATTENTION_MODE_AGGREGATED, layer=0, granularity=pb.ATTENTION_GRANULARITY_WORDS
                ),
            ),
        ]
    )
    requests = []
    for round_ in range(2):
        for i, text in enumerate(MIXED_TEXTS):
            text_input = pb.TextInput(text=text)
            requests.append(pb.GenerateRequest(model=model, text=text_input, request_id=f"{round_}-{i}", **next(options)))
    return requests


def answer(stub, request: pb.GenerateRequest, stream: bool) -> pb.GenerateResponse:
    if stream:
        *_, final = list(stub.GenerateStream(request, timeout=WAIT))
        return final.response
    return stub.Generate(request, timeout=WAIT)


def same_answer(a: pb.GenerateResponse, b: pb.GenerateResponse) -> bool:
    """Equal output, and attention equal up to float rounding (batched rows may round differently)."""
    if [t.id for t in a.tokens] != [t.id for t in b.tokens] or a.text != b.text:
        return False
    if a.HasField("attention") != b.HasField("attention"):
        return False
    return not a.HasField("attention") or (
        list(a.attention.row_labels) == list(b.attention.row_labels)
        and np.allclose(a.attention.weights, b.attention.weights, atol=1e-5)
    )


def run_load(stub, requests, clients: int, per_client: int) -> tuple[int, list[str], int]:
    """(answers, errors, crossed answers) of `clients` threads each sending `per_client` requests."""
    alone = [stub.Generate(r, timeout=WAIT) for r in requests]

    def client(c: int) -> tuple[int, list[str], int]:
        done, errors, crossed = 0, [], 0
        for k in range(per_client):
            i = (c * 7 + k * 3) % len(requests)
            try:
                response = answer(stub, requests[i], stream=(c + k) % 3 == 0)
            except grpc.RpcError as error:
                errors.append(f"{error.code().name}: {error.details()}")
                continue
            done += 1
            crossed += not same_answer(response, alone[i])
        return done, errors, crossed

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(client, range(clients)))
    return sum(r[0] for r in results), [e for r in results for e in r[1]], sum(r[2] for r in results)


def test_64_concurrent_clients_get_their_own_answers(tiny_server):
    background, _ = tiny_server
    with grpc.insecure_channel(background.address) as channel:
        stub = pb_grpc.AttnServeStub(channel)
        answers, errors, crossed = run_load(stub, mixed_requests("tiny-translate"), CLIENTS, REQUESTS_PER_CLIENT)
    assert errors == []
    assert crossed == 0
    assert answers == CLIENTS * REQUESTS_PER_CLIENT
