"""Security: TLS (and mutual TLS) with certificates made in the test, bearer tokens (health stays open), and the
metrics listener on loopback unless told otherwise.
"""

from __future__ import annotations

import datetime
import ipaddress

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from attnserve.server.edge import app, security
from attnserve.server.edge.serve_options import ServeOptions
from attnserve.v1 import attnserve_pb2 as pb
from attnserve.v1 import attnserve_pb2_grpc as pb_grpc
from fakes import WAIT, FakeEngine

REQUEST = pb.GenerateRequest(model="fake-translate", text=pb.TextInput(text="hello"))


def _certificate(name: str, issuer: tuple | None, server: bool):
    """(key, cert) signed by issuer (key, cert), or self-signed CA when issuer is None."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[1].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(issuer[0] if issuer else key, hashes.SHA256())
    return key, cert


def _pem(key, cert) -> tuple[bytes, bytes]:
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files and bytes."""
    folder = tmp_path_factory.mktemp("pki")
    ca = _certificate("attnserve test CA", None, server=False)
    files = {}
    for name, (key, cert) in {
        "ca": ca,
        "server": _certificate("localhost", ca, server=True),
        "client": _certificate("client", ca, server=False),
    }.items():
        key_pem, cert_pem = _pem(key, cert)
        (folder / f"{name}.key").write_bytes(key_pem)
        (folder / f"{name}.crt").write_bytes(cert_pem)
        files[name] = (str(folder / f"{name}.key"), str(folder / f"{name}.crt"), key_pem, cert_pem)
    return files


def _outcome(channel) -> grpc.StatusCode:
    try:
        pb_grpc.AttnServeStub(channel).Generate(REQUEST, timeout=WAIT)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_tls_serves_tls_only(pki):
    key, cert, _, _ = pki["server"]
    ca_pem = pki["ca"][3]
    engine = FakeEngine()
    with app.BackgroundServer({engine.info.name: engine}, tls=security.TlsFiles(cert, key)) as background:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca_pem)
        with grpc.secure_channel(background.address, credentials) as channel:
            assert _outcome(channel) == grpc.StatusCode.OK
        with grpc.insecure_channel(background.address) as channel:
            assert _outcome(channel) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate_the_ca_signed(pki):
    key, cert, _, _ = pki["server"]
    ca_file, ca_pem = pki["ca"][1], pki["ca"][3]
    client_key, client_cert = pki["client"][2], pki["client"][3]
    engine = FakeEngine()
    tls = security.TlsFiles(cert, key, client_ca=ca_file)
    with app.BackgroundServer({engine.info.name: engine}, tls=tls) as background:
        anonymous = grpc.ssl_channel_credentials(root_certificates=ca_pem)
        with grpc.secure_channel(background.address, anonymous) as channel:
            assert _outcome(channel) == grpc.StatusCode.UNAVAILABLE
        known = grpc.ssl_channel_credentials(ca_pem, private_key=client_key, certificate_chain=client_cert)
        with grpc.secure_channel(background.address, known) as channel:
            assert _outcome(channel) == grpc.StatusCode.OK


def test_tls_files_that_cannot_be_read_name_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--tls-key .*cannot be read"):
        security.server_credentials(security.TlsFiles(str(tmp_path / "c.pem"), str(tmp_path / "missing.pem")))
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        ServeOptions(tls_cert="server.crt")


def test_swapped_or_mismatched_tls_files_are_named(pki):
    key, cert, _, _ = pki["server"]
    with pytest.raises(ValueError, match=r"--tls-key .*server.crt: holds no PEM PRIVATE KEY \(are --tls-cert and "
                                         r"--tls-key swapped\?\)"):
        security.server_credentials(security.TlsFiles(key, cert))
    other_key = pki["client"][0]  # a key, but not the certificate's
    engine = FakeEngine()
    with pytest.raises(OSError, match="--tls-key is not the key of --tls-cert"):
        app.BackgroundServer({engine.info.name: engine}, tls=security.TlsFiles(cert, other_key))


def test_the_token_file_is_reloaded_when_it_changes(tmp_path, caplog):
    token_file = tmp_path / "tokens"
    token_file.write_text("first\n")
    tokens = security.TokenFile(str(token_file), check_seconds=0)
    engine = FakeEngine()

    def outcome(channel, token: str) -> grpc.StatusCode:
        try:
            pb_grpc.AttnServeStub(channel).Generate(REQUEST, timeout=WAIT, metadata=[("authorization", f"Bearer {token}")])
        except grpc.RpcError as error:
            return error.code()
        return grpc.StatusCode.OK

    with app.BackgroundServer({engine.info.name: engine}, tokens=tokens) as background, \
            grpc.insecure_channel(background.address) as channel:
        assert outcome(channel, "first") == grpc.StatusCode.OK
        token_file.write_text("first\nsecond-token\n")  # rotation: both for a while
        assert outcome(channel, "second-token") == grpc.StatusCode.OK
        token_file.write_text("second-token\n")
        assert outcome(channel, "first") == grpc.StatusCode.UNAUTHENTICATED
        token_file.write_text("# emptied by mistake\n")  # kept: no token would lock every client out
        assert outcome(channel, "second-token") == grpc.StatusCode.OK
    assert any("holds no token; the 1 tokens read before stay in force" in r.getMessage() for r in caplog.records)


def test_bearer_tokens_guard_every_rpc_but_health(tmp_path):
    token_file = tmp_path / "tokens"
    token_file.write_text("# rotated monthly\nold-secret\n\nnew-secret\n")
    tokens = security.read_tokens(str(token_file))
    assert tokens == {"old-secret", "new-secret"}
    engine = FakeEngine()
    with app.BackgroundServer({engine.info.name: engine}, tokens=tokens) as background:
        with grpc.insecure_channel(background.address) as channel:
            stub = pb_grpc.AttnServeStub(channel)
            for metadata in [None, [("authorization", "Bearer wrong")], [("authorization", "new-secret")]]:
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Generate(REQUEST, timeout=WAIT, metadata=metadata)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.GenerateStream(REQUEST, timeout=WAIT))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            for token in tokens:
                response = stub.Generate(REQUEST, timeout=WAIT, metadata=[("authorization", f"Bearer {token}")])
                assert response.text == "olleh"
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=WAIT)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert len(engine.requests) == 2  # refused calls never reached the model


def test_unauthenticated_generation_calls_are_counted_as_rejections():
    engine = FakeEngine()

    def counts() -> tuple[float, float]:
        rejected = REGISTRY.get_sample_value("attnserve_rejected_requests_total", {"model": "", "code": "UNAUTHENTICATED",
                                                                                "reason": "unauthenticated"})
        finished = REGISTRY.get_sample_value("attnserve_requests_total", {"model": "", "code": "UNAUTHENTICATED"})
        return rejected or 0.0, finished or 0.0

    before = counts()
    with app.BackgroundServer({engine.info.name: engine}, tokens=frozenset({"secret"})) as background:
        with grpc.insecure_channel(background.address) as channel:
            stub = pb_grpc.AttnServeStub(channel)
            with pytest.raises(grpc.RpcError):
                stub.Generate(REQUEST, timeout=WAIT, metadata=[("authorization", "Bearer wrong")])
            with pytest.raises(grpc.RpcError):
                list(stub.GenerateStream(REQUEST, timeout=WAIT))
            # Not a generation request: refused all the same, but not counted as one.
            with pytest.raises(grpc.RpcError) as refused:
                stub.ListModels(pb.ListModelsRequest(), timeout=WAIT)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stub.Generate(REQUEST, timeout=WAIT, metadata=[("authorization", "Bearer secret")])
    # The request is never parsed, so its model is unknown: the "" label that unknown model names share.
    assert [after - earlier for after, earlier in zip(counts(), before)] == [2, 2]


def test_an_empty_token_file_is_refused(tmp_path):
    (tmp_path / "tokens").write_text("# nothing yet\n\n")
    with pytest.raises(ValueError, match="--auth-token-file .* holds no token"):
        security.read_tokens(str(tmp_path / "tokens"))


def test_metrics_listen_on_loopback_unless_told_otherwise():
    assert ServeOptions().metrics_host == "127.0.0.1"
    assert ServeOptions(host="0.0.0.0").metrics_host == "127.0.0.1"  # --host does not expose metrics
