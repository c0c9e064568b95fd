"""How a worker's TLS options are read (no network: the connections are in the integration tier)."""

from __future__ import annotations

import hashlib

import pytest

from echo_runtime.coordinator import tls

HEX = hashlib.sha256(b"a certificate").hexdigest()


@pytest.mark.parametrize(
    "text",
    [
        "sha256:" + HEX,
        "SHA256:" + HEX.upper(),
        ":".join(HEX[i : i + 2] for i in range(0, 64, 2)).upper(),  # as openssl prints it
        "  sha256:" + " ".join(HEX[i : i + 2] for i in range(0, 64, 2)) + "\n",
    ],
)
def test_fingerprints_are_read_in_the_usual_spellings(text: str) -> None:
    assert tls.parse_fingerprint(text) == "sha256:" + HEX


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sha256:" + HEX[:-1], "64 hex digits"),
        ("sha256:" + HEX[:-1] + "g", "64 hex digits"),
        ("sha1:" + HEX[:40], "only sha256"),
        ("", "64 hex digits"),
    ],
)
def test_a_malformed_fingerprint_is_refused_with_the_expected_form(text: str, message: str) -> None:
    with pytest.raises(tls.TLSError, match=message) as refused:
        tls.parse_fingerprint(text)
    assert "--tls-fingerprint" in str(refused.value)


def test_fingerprint_is_sha256_of_the_der_bytes() -> None:
    assert tls.fingerprint(b"a certificate") == "sha256:" + HEX


def test_plain_http_needs_no_tls_and_takes_no_tls_options() -> None:
    assert tls.client_context("http://127.0.0.1:8700") is True
    assert tls.client_context("https://coordinator.example") is True  # system CAs
    with pytest.raises(tls.TLSError, match="--tls-fingerprint needs an https://"):
        tls.client_context("http://127.0.0.1:8700", pinned="sha256:" + HEX)
    with pytest.raises(tls.TLSError, match="scheme must be http or https"):
        tls.client_context("ftp://127.0.0.1")


def test_verify_failure_is_found_through_the_exception_chain() -> None:
    import ssl

    cause = ssl.SSLCertVerificationError("certificate verify failed")
    try:
        try:
            raise cause
        except ssl.SSLError as exc:
            raise ConnectionError("connect failed") from exc
    except ConnectionError as wrapped:
        assert tls.verify_failure(wrapped) is cause
    assert tls.verify_failure(ConnectionError("refused")) is None
