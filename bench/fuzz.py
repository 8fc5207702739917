"""The request fuzzer of tests/test_fuzz.py at length: --cases generated requests (10,000 by default) through
the server's own validation path in process, and --served of them over gRPC to the bundled models, decoded
for real; every answer must be success, INVALID_ARGUMENT, OUT_OF_RANGE or NOT_FOUND (RESOURCE_EXHAUSTED for
what is over gRPC's receive limit), never a server error, and the server must be healthy after.

    python bench/fuzz.py --cases 10000 --served 300

The suite runs a few thousand cases (tests/test_fuzz.py); this is the long run. Reports counts by outcome.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import time

import grpc
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from test_fuzz import ALLOWED, SETTINGS, _validate, requests  # noqa: E402

from attnserve.server.edge import app, errors  # noqa: E402
from attnserve.v1 import attnserve_pb2 as pb  # noqa: E402
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc  # noqa: E402

MODELS = ("translate-zh-en", "speech-en", "caption-emoji")


def in_process(engines, message_limits, cases: int) -> collections.Counter:
    outcomes = collections.Counter()

    @settings(max_examples=cases, **SETTINGS)
    @given(data=st.data())
    def case(data):
        request = data.draw(requests(sorted(engines)))
        try:
            _validate(engines, message_limits, request)
            outcomes["accepted"] += 1
        except Exception as exc:
            code = errors.status_code(exc)
            outcomes[code.name] += 1
            assert code in ALLOWED, f"{type(exc).__name__}: {exc}"

    case()
    return outcomes


def served(background, engines, cases: int) -> collections.Counter:
    outcomes = collections.Counter()
    receive_limit = background.server.limits.receive_bytes
    with grpc.insecure_channel(background.address) as channel:
        generate = channel.unary_unary("/attnserve.v1.AttnServe/Generate", request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)

        @settings(max_examples=cases, **SETTINGS)
        @given(data=st.data())
        def case(data):
            request = data.draw(requests(sorted(engines)))
            allowed = ALLOWED | ({grpc.StatusCode.RESOURCE_EXHAUSTED} if len(request) > receive_limit else set())
            try:
                generate(request, timeout=300)
                outcomes["OK"] += 1
            except grpc.RpcError as error:
                outcomes[error.code().name] += 1
                assert error.code() in allowed, f"{error.code()}: {error.details()[:300]}"

        case()
        ok = pb.GenerateRequest(model=MODELS[0], text=pb.TextInput(text="我们明天去公园散步吧。"))
        assert pb_grpc.AttnServeStub(channel).Generate(ok, timeout=300).tokens  # still healthy
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="models")
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--served", type=int, default=300)
    parser.add_argument("--out", help="write the counts as JSON here")
    args = parser.parse_args()
    engines = app.load_engines(app.ServeOptions(models=args.models, only_models=MODELS))
    try:
        started = time.perf_counter()
        local = in_process(engines, app._message_limits(engines), args.cases)
        middle = time.perf_counter()
        with app.BackgroundServer(engines) as background:
            remote = served(background, engines, args.served)
        figures = {"in_process": dict(local), "in_process_seconds": middle - started,
                   "served": dict(remote), "served_seconds": time.perf_counter() - middle}
    finally:
        for engine in engines.values():
            engine.close()
    print(json.dumps(figures, indent=2))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
