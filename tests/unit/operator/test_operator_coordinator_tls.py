"""The coordinator's TLS certificate: the names it carries, when it is re-issued, and that Python's own
TLS stack accepts it for those names and refuses it for others (real handshakes over a socket pair)."""

from __future__ import annotations

import datetime
import pathlib
import socket
import ssl
import threading

import pytest
from cryptography import x509

from echo_operator import coordinator_tls as ct
from echo_operator import names
from echo_runtime.coordinator import tls as runtime_tls

NOW = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC)
SERVICE_NAMES = (
    "demo-coordinator-external",
    "demo-coordinator-external.ml",
    "demo-coordinator-external.ml.svc",
    "demo-coordinator-external.ml.svc.cluster.local",
)


def handshake(tmp_path: pathlib.Path, cert: str, key: str, ca: str, server_name: str) -> str | None:
    """A TLS handshake of a client trusting ``ca`` with a server holding ``cert``: None, or the error."""
    (tmp_path / "c.pem").write_text(cert)
    (tmp_path / "k.pem").write_text(key)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    client_ctx = ssl.create_default_context(cadata=ca)
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(a, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname=server_name) as c:
            c.sendall(b"x")
        return None
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message)
    finally:
        b.close()
        thread.join(10)


def test_hosts_are_the_services_names_its_addresses_and_the_annotated_host() -> None:
    assert ct.hosts("demo", "ml", {}, None) == tuple(sorted(SERVICE_NAMES))
    service = {
        "spec": {"externalIPs": ["198.51.100.4"]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}, {"hostname": "lb.example.com"}]}},
    }
    annotations = {names.EXTERNAL_URL: "https://echo.example.org:443/x"}
    got = ct.hosts("demo", "ml", annotations, service)
    assert set(got) == {*SERVICE_NAMES, "198.51.100.4", "203.0.113.7", "lb.example.com", "echo.example.org"}
    assert list(got) == sorted(got)


def test_an_issued_certificate_is_accepted_for_its_names_and_refused_otherwise(
    tmp_path: pathlib.Path,
) -> None:
    data, why = ct.issued_data(
        {}, ("127.0.0.1", *SERVICE_NAMES), "demo", "ml", datetime.datetime.now(datetime.UTC)
    ) or ({}, "")
    assert why == "new CA"
    cert, key, ca = data["tls.crt"], data["tls.key"], data["ca.crt"]
    assert handshake(tmp_path, cert, key, ca, "demo-coordinator-external.ml.svc") is None
    assert handshake(tmp_path, cert, key, ca, "127.0.0.1") is None  # an IP SAN, as a load balancer's
    wrong_name = handshake(tmp_path, cert, key, ca, "other.ml.svc")
    assert wrong_name is not None and "mismatch" in wrong_name.lower()
    other_ca, _ = ct.issue_ca("other", "ml", datetime.datetime.now(datetime.UTC))
    wrong_ca = handshake(tmp_path, cert, key, other_ca, "127.0.0.1")
    assert wrong_ca is not None and "unable to get local issuer" in wrong_ca
    # The leaf cannot sign: a certificate it "issued" would not chain.
    leaf = x509.load_pem_x509_certificate(cert.encode())
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def test_the_fingerprint_is_what_a_worker_pins() -> None:
    data, _ = ct.issued_data({}, SERVICE_NAMES, "demo", "ml", NOW) or ({}, "")
    der = ssl.PEM_cert_to_DER_cert(data["tls.crt"])
    assert ct.fingerprint(data["tls.crt"]) == runtime_tls.fingerprint(der)
    assert runtime_tls.parse_fingerprint(ct.fingerprint(data["tls.crt"])) == ct.fingerprint(data["tls.crt"])


def test_reissue_only_when_names_change_or_expiry_nears_and_keep_the_ca() -> None:
    first, _ = ct.issued_data({}, SERVICE_NAMES, "demo", "ml", NOW) or ({}, "")
    assert ct.issued_data(first, SERVICE_NAMES, "demo", "ml", NOW) is None  # idempotent
    assert ct.issued_data(first, tuple(reversed(SERVICE_NAMES)), "demo", "ml", NOW) is None  # order
    # A load balancer's address arrives: a new certificate under the same CA.
    more = ("203.0.113.7", *SERVICE_NAMES)
    second, why = ct.issued_data(first, more, "demo", "ml", NOW) or ({}, "")
    assert "names it must carry changed" in why and "203.0.113.7" in why
    assert second["ca.crt"] == first["ca.crt"] and second["ca.key"] == first["ca.key"]
    assert second["tls.crt"] != first["tls.crt"] and second["tls.key"] != first["tls.key"]
    assert ct.certificate_hosts(x509.load_pem_x509_certificate(second["tls.crt"].encode())) == tuple(
        sorted(more)
    )
    # Renewal: 30 days before the year runs out, not before.
    assert ct.issued_data(second, more, "demo", "ml", NOW + datetime.timedelta(days=330)) is None
    later = NOW + datetime.timedelta(days=340)
    third, why = ct.issued_data(second, more, "demo", "ml", later) or ({}, "")
    assert why.startswith("it expires at") and third["ca.crt"] == first["ca.crt"]
    # A CA that cannot cover another year is replaced, and the certificate with it.
    near_end = NOW + datetime.timedelta(days=ct.CA_DAYS - 200)
    fourth, why = ct.issued_data(third, more, "demo", "ml", near_end) or ({}, "")
    assert why == "the CA could not sign any more" and fourth["ca.crt"] != first["ca.crt"]
    assert ct.leaf_problem(fourth, more, near_end) is None


def test_a_certificate_of_another_ca_or_a_damaged_secret_is_reissued() -> None:
    mine, _ = ct.issued_data({}, SERVICE_NAMES, "demo", "ml", NOW) or ({}, "")
    theirs, _ = ct.issued_data({}, SERVICE_NAMES, "other", "ml", NOW) or ({}, "")
    mixed = {**mine, "tls.crt": theirs["tls.crt"], "tls.key": theirs["tls.key"]}
    assert ct.leaf_problem(mixed, SERVICE_NAMES, NOW) == "the certificate is not signed by the job's CA"
    # The same CA name with another key (a CA re-made by hand): the signature tells them apart.
    twin, _ = ct.issued_data({}, SERVICE_NAMES, "demo", "ml", NOW) or ({}, "")
    forged = {**mine, "tls.crt": twin["tls.crt"], "tls.key": twin["tls.key"]}
    assert ct.leaf_problem(forged, SERVICE_NAMES, NOW) == "the certificate is not signed by the job's CA"
    assert (
        ct.leaf_problem({**mine, "tls.crt": "garbage"}, SERVICE_NAMES, NOW)
        == "the certificate cannot be read"
    )
    assert ct.leaf_problem({**mine, "tls.key": ""}, SERVICE_NAMES, NOW) == "no certificate yet"
    fixed, _ = ct.issued_data(mixed, SERVICE_NAMES, "demo", "ml", NOW) or ({}, "")
    assert fixed["ca.crt"] == mine["ca.crt"] and ct.leaf_problem(fixed, SERVICE_NAMES, NOW) is None
    # A CA key that is not the CA certificate's: a new CA.
    assert not ct.ca_usable({**mine, "ca.key": theirs["ca.key"]}, NOW)


def test_a_users_secret_must_hold_a_certificate_and_key() -> None:
    data, _ = ct.issued_data({}, SERVICE_NAMES, "demo", "ml", NOW) or ({}, "")
    assert ct.provided_problem("cm-cert", {"tls.crt": data["tls.crt"], "tls.key": data["tls.key"]}) is None
    assert ct.provided_problem("cm-cert", {"tls.crt": data["tls.crt"]}) == (
        "Secret cm-cert has no tls.key (a kubernetes.io/tls Secret, e.g. cert-manager's)"
    )
    assert "tls.crt is not a PEM certificate" in (
        ct.provided_problem("x", {"tls.crt": "no", "tls.key": "k"}) or ""
    )


def test_the_secret_object_is_a_tls_secret_of_the_job() -> None:
    obj = ct.secret_object(
        "demo", "ml", {"uid": "u"}, {"tls.crt": "C", "tls.key": "K", "ca.crt": "A", "ca.key": "B"}
    )
    assert obj["type"] == "kubernetes.io/tls" and obj["metadata"]["name"] == names.coordinator_tls("demo")
    assert obj["metadata"]["ownerReferences"] == [{"uid": "u"}]
    assert list(obj["data"]) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    with pytest.raises(ValueError, match="at least one name"):
        ct.issue_leaf(*ct.issue_ca("demo", "ml", NOW), (), NOW)
