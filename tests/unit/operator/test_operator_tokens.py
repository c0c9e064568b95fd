"""Join tokens: who needs one, what the coordinator learns of them, where external workers connect."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from echo_operator import names, tokens
from echo_runtime import spec


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
    assert tokens.address_patch({"token": "dA=="}, url) == {"data": {"coordinator": encoded}}
    assert tokens.address_patch({"coordinator": base64.b64encode(b"http://old:8700").decode()}, url) == {
        "data": {"coordinator": encoded}
    }
    assert tokens.address_patch({"coordinator": encoded}, url) is None
    assert tokens.address_patch({"token": "dA=="}, None) is None  # not an external pool, or no address
