"""Bearer-token auth and TLS on the gRPC port (and HTTPS on the HTTP port)."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import urllib.request
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from argus.proto import collector_pb2 as pb
from argus.proto import collector_pb2_grpc as pb_grpc
from tests.collector.test_roundtrip import read_back
from tests.collector.wire import batch, channel, sample, stream

pytestmark = pytest.mark.slow


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost / 127.0.0.1 signed by its own key: (cert.pem, key.pem)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def test_a_token_is_required_and_nothing_is_written_without_it(argus_server_factory) -> None:
    server = argus_server_factory("--no-analyzer", "--token", "s3cret")
    b = batch("steps", sample("steps"), seq=1)
    for metadata in (None, [("authorization", "Bearer wrong")], [("authorization", "s3cret")]):
        with pytest.raises(grpc.RpcError) as raised:
            stream(server.grpc_target, [b], metadata=metadata)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "authorization: Bearer TOKEN" in (raised.value.details() or "")
    with channel(server.grpc_target) as ch, pytest.raises(grpc.RpcError) as raised:
        pb_grpc.CollectorStub(ch).Clock(pb.ClockRequest(), timeout=10)
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert server.stop() == 0
    assert read_back(server.store_url, "SELECT count() AS n FROM steps").column("n")[0].as_py() == 0
    assert read_back(server.store_url, "SELECT count() AS n FROM ingest_batches").column("n")[0].as_py() == 0

    server.start()
    acks = stream(server.grpc_target, [b], metadata=[("authorization", "Bearer s3cret")])
    assert [a.status for a in acks] == [pb.Ack.STORED]


def test_tls_with_a_self_signed_pair(argus_server_factory, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    server = argus_server_factory("--no-analyzer", "--tls-cert", str(cert), "--tls-key", str(key))
    assert server.http_url.startswith("https://")
    root = cert.read_bytes()
    acks = stream(server.grpc_target, [batch("steps", sample("steps"), seq=1)], root_cert=root)
    assert [a.status for a in acks] == [pb.Ack.STORED]
    # A plaintext client cannot talk to it.
    with pytest.raises(grpc.RpcError) as raised:
        stream(server.grpc_target, [batch("steps", sample("steps"), seq=2)], timeout_s=5)
    assert raised.value.code() in {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
    # HTTPS on the HTTP port, verified against the same certificate.
    context = ssl.create_default_context(cafile=str(cert))
    with urllib.request.urlopen(f"{server.http_url}/healthz", context=context, timeout=10) as reply:
        assert reply.status == 200
    assert server.stop() == 0
    assert read_back(server.store_url, "SELECT seq FROM ingest_batches").column("seq").to_pylist() == [1]


def test_tls_needs_both_files(argus_server_factory, tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path)
    server = argus_server_factory("--no-analyzer", "--tls-cert", str(cert), start=False)
    with pytest.raises(RuntimeError, match="--tls-cert and --tls-key go together"):
        server.start()
