"""TLS between workers and the coordinator: how a worker decides to trust the coordinator it joins.

A worker outside the cluster joins over the coordinator's external address, which nothing else
protects: its join token and every rollout go over that connection. The coordinator then serves TLS
(``echorl coordinator --tls-cert/--tls-key``) and the worker verifies it in one of two ways:

* ``--ca-file``: the certificate must chain to this CA and name the host in the URL (standard
  verification; the CA is the job's, or your own);
* ``--tls-fingerprint sha256:<hex>``: the coordinator's own certificate must be exactly this one
  (pinning; no hostname check, so it also works on an address the certificate does not name). The
  certificate is fetched once, compared, and then every connection must present that certificate:
  a coordinator that changes its certificate is refused, not silently trusted.

Without either, an ``https://`` URL is verified against the system's CAs. Every refusal is a
:class:`TLSError` that says what was expected and what was found; workers do not retry it.
"""

from __future__ import annotations

import hashlib
import re
import socket
import ssl
import time
import urllib.parse
from pathlib import Path

_HEX = re.compile(r"^[0-9a-f]{64}$")


class TLSError(Exception):
    """The coordinator cannot be trusted as configured (or the configuration is wrong)."""


def fingerprint(der: bytes) -> str:
    """``sha256:<hex>`` of a DER certificate (what ``openssl x509 -fingerprint -sha256`` shows, in lower case
    and without colons)."""
    return "sha256:" + hashlib.sha256(der).hexdigest()


def parse_fingerprint(text: str) -> str:
    """Normalise ``sha256:AB:CD…`` / ``AB CD…`` / ``abcd…`` to ``sha256:<64 lower-case hex>``."""
    value = text.strip()
    if value.lower().startswith("sha256:"):
        value = value[len("sha256:") :]
    elif ":" in value and not re.fullmatch(r"[0-9A-Fa-f:]+", value):
        raise TLSError(f"--tls-fingerprint: only sha256 fingerprints are accepted, got {text!r}")
    digits = re.sub(r"[\s:]", "", value).lower()
    if not _HEX.match(digits):
        raise TLSError(f"--tls-fingerprint: expected sha256:<64 hex digits> (colons allowed), got {text!r}")
    return "sha256:" + digits


def _endpoint(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None:
        raise TLSError(f"coordinator URL {url!r} has no host")
    return parts.hostname, parts.port or 443


def client_context(
    url: str,
    *,
    ca_file: str | None = None,
    pinned: str | None = None,
    timeout: float = 10.0,
    wait: float = 60.0,
) -> ssl.SSLContext | bool:
    """What httpx's ``verify`` gets for ``url``: ``True`` (system CAs) or a context for the CA/pin.

    A pin is checked here, once, against the certificate the coordinator presents now; a coordinator
    that does not accept connections yet is waited for up to ``wait`` seconds.
    """
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise TLSError(f"coordinator URL {url!r}: the scheme must be http or https")
    if ca_file is not None and pinned is not None:
        raise TLSError("--ca-file and --tls-fingerprint: give one of them, not both")
    if scheme == "http":
        if ca_file is not None or pinned is not None:
            option = "--ca-file" if ca_file is not None else "--tls-fingerprint"
            raise TLSError(f"{option} needs an https:// coordinator URL, got {url!r}")
        return True
    if ca_file is not None:
        return _ca_context(ca_file)
    if pinned is not None:
        return _pinned_context(url, parse_fingerprint(pinned), timeout, wait)
    return True


def _ca_context(ca_file: str) -> ssl.SSLContext:
    path = Path(ca_file)
    if not path.is_file():
        raise TLSError(f"--ca-file {ca_file}: no such file")
    text = path.read_text(errors="replace")
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise TLSError(f"--ca-file {ca_file}: not a PEM certificate (no BEGIN CERTIFICATE line)")
    try:
        return ssl.create_default_context(cafile=str(path))
    except ssl.SSLError as exc:
        raise TLSError(f"--ca-file {ca_file}: cannot be read as a CA certificate ({exc})") from exc


def _pinned_context(url: str, pinned: str, timeout: float, wait: float) -> ssl.SSLContext:
    host, port = _endpoint(url)
    probe = ssl.create_default_context()
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE  # only to read the certificate; it is compared before any use
    deadline = time.monotonic() + wait
    while True:  # a coordinator not up yet is waited for, as the client's retries would
        try:
            with (
                socket.create_connection((host, port), timeout=timeout) as sock,
                probe.wrap_socket(sock, server_hostname=host) as tls,
            ):
                der = tls.getpeercert(binary_form=True)
            break
        except (ConnectionError, TimeoutError) as exc:
            if time.monotonic() >= deadline:
                raise TLSError(
                    f"coordinator {url}: could not read its certificate in {wait:.0f} s ({exc})"
                ) from exc
            time.sleep(1.0)
        except (OSError, ssl.SSLError) as exc:
            raise TLSError(f"coordinator {url}: could not read its certificate ({exc})") from exc
    if der is None:
        raise TLSError(f"coordinator {url} presented no certificate")
    found = fingerprint(der)
    if found != pinned:
        raise TLSError(
            f"coordinator {url} presents certificate {found}, not the pinned {pinned}: refusing to send "
            "it the join token (wrong address, a re-issued certificate, or someone in between)"
        )
    context = ssl.create_default_context(cadata=ssl.DER_cert_to_PEM_cert(der))
    context.check_hostname = False  # the pin names the certificate itself, not a host
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # trust this leaf even if it is not a root
    return context


def verify_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate-verification error somewhere in ``exc``'s chain, if that is what it is."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
