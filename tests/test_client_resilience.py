"""The clients against servers that fail, several servers, TLS and bearer tokens: typed errors, retries
with backoff, deadlines, round robin, credentials and health."""

from __future__ import annotations

import asyncio
import random
import shutil
import subprocess

import grpc
import pytest
from attnserve.clients import errors
from attnserve.clients.client import AsyncClient, Client, RetryPolicy, TlsOptions, translation_request
from attnserve.clients.retry import NO_RETRY
from attnserve.api import generation
from attnserve.server.edge import app, security
from fakes import WAIT, FakeEngine

MODEL = "fake-translate"
QUICK = RetryPolicy(attempts=4, initial_backoff=0.01, max_backoff=0.05)  # retries without slowing the tests


class FlakyEngine(FakeEngine):
    """A FakeEngine that refuses its first `refusals` requests as overloaded (RESOURCE_EXHAUSTED)."""

    def __init__(self, refusals: int = 0):
        super().__init__()
        self.refusals = refusals
        self.refused = 0

    def submit(self, request, on_token=None):
        if self.refused < self.refusals:
            self.refused += 1
            raise generation.OverloadedError("queue full")
        return super().submit(request, on_token)


@pytest.fixture
def flaky():
    engine = FlakyEngine()
    with app.BackgroundServer({MODEL: engine}) as background:
        yield background.address, engine


# ---- typed errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, cls",
    [
        (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
        (grpc.StatusCode.OUT_OF_RANGE, errors.OutOfRange),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted),
        (grpc.StatusCode.UNAVAILABLE, errors.Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, errors.DeadlineExceeded),
        (grpc.StatusCode.UNAUTHENTICATED, errors.Unauthenticated),
        (grpc.StatusCode.UNIMPLEMENTED, errors.Unimplemented),
        (grpc.StatusCode.INTERNAL, errors.Internal),
        (grpc.StatusCode.ABORTED, errors.AttnServeError),
    ],
)
def test_each_status_code_has_its_exception_class(code, cls):
    error = errors.from_status(code, "why")
    assert type(error) is cls and isinstance(error, errors.AttnServeError)
    assert (error.code, error.details, str(error)) == (code, "why", f"{code.name}: why")


def test_a_server_error_arrives_as_its_class(flaky):
    address, _ = flaky
    with Client(address, timeout=WAIT) as client, pytest.raises(errors.NotFound) as raised:
        client.translate("abc", model="nope")
    assert "unknown model 'nope'" in raised.value.details


# ---- retries and deadlines ---------------------------------------------------------------------------


def test_backoff_grows_to_its_ceiling_with_jitter_below_it():
    policy = RetryPolicy(attempts=10, initial_backoff=0.1, max_backoff=1.0, multiplier=2.0, jitter=0.5)
    rng = random.Random(0)
    waits = [[policy.backoff(retry, rng) for _ in range(200)] for retry in range(6)]
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    for drawn, ceiling in zip(waits, ceilings, strict=True):
        assert all(ceiling / 2 <= w <= ceiling for w in drawn)
        assert max(drawn) - min(drawn) > ceiling / 4  # the jitter spreads clients refused together


def test_only_unavailable_and_overload_are_retried_and_never_past_the_deadline():
    policy = RetryPolicy(attempts=3, initial_backoff=0.1, jitter=0.0)
    assert policy.delay(1, grpc.StatusCode.UNAVAILABLE, None) == 0.1
    assert policy.delay(2, grpc.StatusCode.RESOURCE_EXHAUSTED, 5.0) == 0.2
    assert policy.delay(3, grpc.StatusCode.UNAVAILABLE, None) is None  # attempts used up
    assert policy.delay(1, grpc.StatusCode.INVALID_ARGUMENT, None) is None
    assert policy.delay(1, grpc.StatusCode.DEADLINE_EXCEEDED, None) is None
    assert policy.delay(1, grpc.StatusCode.UNAVAILABLE, 0.05) is None  # the wait would outlast the deadline


@pytest.mark.parametrize("fields, message", [({"attempts": 0}, "attempts"), ({"initial_backoff": 3.0}, "max_backoff")])
def test_a_bad_retry_policy_names_its_field(fields, message):
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**fields)


def test_an_overloaded_server_is_retried_until_it_answers(flaky):
    address, engine = flaky
    engine.refusals = 2
    with Client(address, timeout=WAIT, retry=QUICK) as client:
        assert client.translate("abc", model=MODEL).text == "cba"
    assert engine.refused == 2 and len(engine.requests) == 1


def test_retries_stop_after_the_policys_attempts(flaky):
    address, engine = flaky
    engine.refusals = 10
    with Client(address, timeout=WAIT, retry=QUICK) as client, pytest.raises(errors.ResourceExhausted):
        client.translate("abc", model=MODEL)
    assert engine.refused == QUICK.attempts
    engine.refused = 0
    with Client(address, timeout=WAIT, retry=NO_RETRY) as client, pytest.raises(errors.ResourceExhausted):
        client.translate("abc", model=MODEL)
    assert engine.refused == 1


def test_a_stream_refused_before_its_first_token_is_retried(flaky):
    address, engine = flaky
    engine.refusals = 1
    with Client(address, timeout=WAIT, retry=QUICK) as client:
        *tokens, result = list(client.stream(translation_request("abcd", model=MODEL)))
    assert engine.refused == 1 and [t.token for t in tokens] == result.tokens and result.text == "dcba"


def test_the_deadline_covers_the_call(flaky):
    address, engine = flaky
    engine.gate.clear()  # the worker holds every request
    try:
        with Client(address, timeout=0.3, retry=QUICK) as client, pytest.raises(errors.DeadlineExceeded):
            client.translate("abc", model=MODEL)
    finally:
        engine.gate.set()


# ---- several servers ---------------------------------------------------------------------------------


def test_calls_go_to_each_address_in_turn():
    first, second = FakeEngine(), FakeEngine()
    with app.BackgroundServer({MODEL: first}) as a, app.BackgroundServer({MODEL: second}) as b:
        with Client(f"{a.address},{b.address}", timeout=WAIT) as client:
            for _ in range(6):
                client.translate("abc", model=MODEL)
    assert len(first.requests) == len(second.requests) == 3


def test_a_dead_address_costs_no_failed_call():
    engine = FakeEngine()
    with app.BackgroundServer({MODEL: engine}) as live:
        with Client(["127.0.0.1:1", live.address], timeout=WAIT, retry=QUICK) as client:
            texts = [client.translate("abc", model=MODEL).text for _ in range(4)]
            health = client.health()
    assert texts == ["cba"] * 4 and len(engine.requests) == 4
    assert health == {"127.0.0.1:1": "UNAVAILABLE", live.address: "SERVING"}


def test_async_client_retries_and_round_robins():
    first, second = FlakyEngine(refusals=1), FakeEngine()
    with app.BackgroundServer({MODEL: first}) as a, app.BackgroundServer({MODEL: second}) as b:

        async def scenario():
            async with AsyncClient([a.address, b.address], timeout=WAIT, retry=QUICK) as client:
                texts = [(await client.translate("abc", model=MODEL)).text for _ in range(3)]
                streamed = [e async for e in client.stream(translation_request("ab", model=MODEL))]
                with pytest.raises(errors.NotFound):
                    await client.get_model("nope")
            return texts, streamed

        texts, streamed = asyncio.run(scenario())
    # Call 1 was refused by the first server and retried on the second; calls 2 and 3 went one to each.
    assert texts == ["cba"] * 3 and first.refused == 1
    assert len(first.requests) + len(second.requests) == 4 and first.requests and second.requests
    assert streamed[-1].text == "ba"


# ---- credentials -------------------------------------------------------------------------------------


def test_a_bearer_token_is_sent_with_every_call():
    engine = FakeEngine()
    with app.BackgroundServer({MODEL: engine}, tokens=frozenset({"s3cret"})) as background:
        with Client(background.address, timeout=WAIT, token="s3cret") as client:
            assert client.translate("abc", model=MODEL).text == "cba"
            *tokens, result = client.stream(translation_request("ab", model=MODEL))
            assert [t.index for t in tokens] == [0, 1] and result.text == "ba"
        with Client(background.address, timeout=WAIT, token="wrong") as client:
            with pytest.raises(errors.Unauthenticated):
                client.list_models()
            assert client.health() == {background.address: "SERVING"}  # health stays open


def test_a_token_must_be_one_line():
    with pytest.raises(ValueError, match="one non-empty line"):
        Client("127.0.0.1:1", token="a\nb")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """(cert, key) PEM files of a self-signed certificate for 127.0.0.1 and localhost."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return str(cert), str(key)


def test_tls_with_a_private_ca(certificate):
    cert, key = certificate
    engine = FakeEngine()
    with app.BackgroundServer({MODEL: engine}, tls=security.TlsFiles(cert, key)) as background:
        with Client(background.address, timeout=WAIT, tls=TlsOptions(root_certificates=cert)) as client:
            assert client.translate("abc", model=MODEL).text == "cba"
        # A plaintext client cannot talk to the TLS port; neither can one that does not trust the certificate.
        with Client(background.address, timeout=2, retry=NO_RETRY) as client, pytest.raises(errors.Unavailable):
            client.list_models()
        with Client(background.address, timeout=2, tls=True, retry=NO_RETRY) as client:
            with pytest.raises(errors.Unavailable):
                client.list_models()


def test_tls_options_check_their_files(tmp_path):
    with pytest.raises(ValueError, match="go together"):
        TlsOptions(certificate="c.pem")
    with pytest.raises(ValueError, match="cannot read"):
        Client("127.0.0.1:1", tls=TlsOptions(root_certificates=str(tmp_path / "missing.pem")))
