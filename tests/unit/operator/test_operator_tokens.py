"""Join tokens: who needs one, what the coordinator learns of them, where external workers connect."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from echo_operator import names, tokens
from echo_operator.children import inputs
from echo_runtime import spec

TLS = inputs.TLSWiring("demo-coordinator-tls", "sha256:" + "cd" * 32, "-----BEGIN CERTIFICATE-----\n")


def lb(*ingress: dict[str, str]) -> dict[str, Any]:
    return {"status": {"loadBalancer": {"ingress": list(ingress)}}}


def test_the_annotation_wins_over_the_load_balancer() -> None:
    url = tokens.external_url({names.EXTERNAL_URL: "https://echo.example.com"}, lb({"ip": "203.0.113.7"}))
    assert url == "https://echo.example.com"


def test_a_load_balancer_ip_or_hostname_becomes_the_coordinator_url() -> None:
    assert tokens.external_url({}, lb({"ip": "203.0.113.7"})) == "http://203.0.113.7:8700"
    assert tokens.external_url({}, lb({"hostname": "lb.example.com"})) == "http://lb.example.com:8700"
    assert (
        tokens.external_url({}, lb({"hostname": "a.example"}, {"ip": "10.0.0.1"})) == "http://a.example:8700"
    )


def test_with_tls_the_load_balancer_address_is_https_on_the_tls_port() -> None:
    assert tokens.external_url({}, lb({"ip": "203.0.113.7"}), tls=True) == "https://203.0.113.7:8443"
    assert tokens.external_url({}, lb({"ip": "2001:db8::7"}), tls=True) == "https://[2001:db8::7]:8443"
    # The annotation is the user's address as given, TLS or not.
    assert (
        tokens.external_url({names.EXTERNAL_URL: "http://in.example"}, None, tls=True) == "http://in.example"
    )


def test_external_fields_pin_the_coordinators_own_certificate_only_through_its_service() -> None:
    fields = tokens.external_fields({}, lb({"ip": "203.0.113.7"}), TLS)
    assert fields == {
        "coordinator": "https://203.0.113.7:8443",
        "fingerprint": TLS.fingerprint,
        "ca.crt": TLS.ca,
    }
    # An Ingress (annotated) presents its own certificate: no pin, and one left from before is removed.
    annotated = tokens.external_fields(
        {names.EXTERNAL_URL: "https://echo.example.com"}, lb({"ip": "1.2.3.4"}), TLS
    )
    assert annotated == {"coordinator": "https://echo.example.com", "fingerprint": None, "ca.crt": None}
    assert tokens.external_fields({}, lb(), TLS) is None  # no address yet: nothing to tell
    plain = tokens.external_fields({}, lb({"ip": "203.0.113.7"}), None)
    assert plain == {"coordinator": "http://203.0.113.7:8700", "fingerprint": None, "ca.crt": None}


def test_no_address_yet() -> None:
    assert tokens.external_url({}, None) is None
    assert tokens.external_url({}, {"status": {}}) is None
    assert tokens.external_url({}, lb()) is None
    assert tokens.external_url({}, lb({})) is None  # an ingress entry without an address
    assert tokens.external_url({names.EXTERNAL_URL: ""}, None) is None


def test_roles_are_the_trainer_and_every_pool_external_ones_marked(hetero_text: str) -> None:
    docs = spec.load_documents(hetero_text)
    job = next(d for d in docs if isinstance(d, spec.EchoJob))
    roles, external = tokens.roles(spec.resolve(job, docs))
    assert roles == [
        "trainer",
        "status",
        "gpu",
        "cpu",
        "mac",
        "shared",
    ]  # status: the operator's read-only one
    assert external == {"mac"}


def test_the_coordinator_gets_digests_not_tokens() -> None:
    out = tokens.digests({"trainer": "s3cret", "cpu": "other"})
    assert out["trainer"] == hashlib.sha256(b"s3cret").hexdigest()
    assert out["cpu"] == hashlib.sha256(b"other").hexdigest()
    assert "s3cret" not in str(out)


def test_the_address_is_patched_only_when_it_differs() -> None:
    url = "http://203.0.113.7:8700"
    encoded = base64.b64encode(url.encode()).decode()
    fields = {"coordinator": url}
    assert tokens.address_patch({"token": "dA=="}, fields) == {"data": {"coordinator": encoded}}
    assert tokens.address_patch({"coordinator": base64.b64encode(b"http://old:8700").decode()}, fields) == {
        "data": {"coordinator": encoded}
    }
    assert tokens.address_patch({"coordinator": encoded}, fields) is None
    assert tokens.address_patch({"token": "dA=="}, None) is None  # not an external pool, or no address


def test_a_new_fingerprint_is_patched_in_and_a_stale_one_patched_out() -> None:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    url = "https://203.0.113.7:8443"
    have = {"token": "dA==", "coordinator": b64(url), "fingerprint": b64("sha256:" + "00" * 32)}
    patch = tokens.address_patch(have, {"coordinator": url, "fingerprint": TLS.fingerprint, "ca.crt": None})
    assert patch == {"data": {"fingerprint": b64(TLS.fingerprint)}}  # ca.crt absent already: no change
    patch = tokens.address_patch(have, {"coordinator": url, "fingerprint": None, "ca.crt": None})
    assert patch == {"data": {"fingerprint": None}}  # a merge patch's null deletes the key
