"""Storage credentials: which keys inference pods get, when the store is set up again, cleanup."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from echo_operator import credentials, names, storage
from echo_runtime import spec

CREDS = storage.Credentials("AK", "SK")


def store(**extra: Any) -> spec.Storage:
    return spec.Storage.model_validate(
        {"type": "S3", "endpoint": "minio:9000", "bucket": "snaps", "credentialsSecret": "creds", **extra}
    )


@pytest.mark.parametrize(
    ("storage_spec", "annotations", "expected"),
    [
        ({"type": "S3", "deletePolicy": "Delete"}, {}, True),
        ({"type": "S3", "deletePolicy": "Retain"}, {}, False),
        ({"type": "S3"}, {names.READONLY_ACCOUNT: "echorl-ro-x"}, True),
        ({"type": "S3"}, {"other": "x"}, False),
        ({"type": "Local", "deletePolicy": "Delete"}, {names.READONLY_ACCOUNT: "x"}, False),
        (None, {}, False),
    ],
)
def test_a_finalizer_only_where_there_is_external_cleanup(
    storage_spec: dict[str, Any] | None, annotations: dict[str, str], expected: bool
) -> None:
    body = {"metadata": {"annotations": annotations}, "spec": {"storage": storage_spec}}
    assert credentials.needs_cleanup(body) is expected


def test_a_missing_secret_says_which_and_what_keys_it_needs() -> None:
    message = credentials.credentials_problem("creds", "ml", None)
    assert message is not None
    assert "'creds'" in message and "namespace ml" in message and "accessKey and secretKey" in message


@pytest.mark.parametrize(
    ("data", "missing"),
    [
        ({}, "accessKey, secretKey"),
        ({"accessKey": "a"}, "secretKey"),
        ({"accessKey": "", "secretKey": "s"}, "accessKey"),
    ],
)
def test_missing_keys_are_named(data: dict[str, str], missing: str) -> None:
    assert credentials.credentials_problem("creds", "ml", data) == f"Secret 'creds' has no key(s) {missing}"


def test_a_complete_secret_has_no_problem_and_gives_credentials() -> None:
    data = {"accessKey": "a", "secretKey": "s", "extra": "x"}
    assert credentials.credentials_problem("creds", "ml", data) is None
    assert credentials.usable(data) == storage.Credentials("a", "s")
    assert credentials.usable(None) is None
    assert credentials.usable({"accessKey": "a"}) is None


def test_the_store_is_set_up_again_when_the_job_the_settings_or_the_key_change() -> None:
    base = credentials.fingerprint("uid-1", store(), CREDS)
    assert credentials.fingerprint("uid-1", store(), CREDS) == base
    assert credentials.fingerprint("uid-2", store(), CREDS) != base  # a re-created job
    assert credentials.fingerprint("uid-1", store(prefix="p"), CREDS) != base
    assert credentials.fingerprint("uid-1", store(), storage.Credentials("AK2", "SK")) != base
    assert credentials.fingerprint("uid-1", store(), None) != base


def test_read_only_keys_in_the_users_secret_come_first() -> None:
    data = {"accessKey": "a", "secretKey": "s", "readOnlyAccessKey": "r", "readOnlySecretKey": "t"}
    wiring, issue = credentials.wiring(
        store(), data, "j", issued_before=True, creds=CREDS, readonly_unsupported=False
    )
    assert issue is None
    assert (wiring.secret, wiring.access_key, wiring.secret_key) == ("creds", "accessKey", "secretKey")
    assert (wiring.readonly_secret, wiring.readonly_access_key, wiring.readonly_secret_key) == (
        "creds",
        "readOnlyAccessKey",
        "readOnlySecretKey",
    )


def test_half_a_read_only_pair_is_not_used() -> None:
    data = {"accessKey": "a", "secretKey": "s", "readOnlyAccessKey": "r"}
    wiring, issue = credentials.wiring(
        store(), data, "j", issued_before=False, creds=CREDS, readonly_unsupported=False
    )
    assert wiring.readonly_secret == "j-storage-readonly"
    assert issue == CREDS


def test_an_issued_secret_is_reused_not_issued_again() -> None:
    wiring, issue = credentials.wiring(
        store(), {}, "j", issued_before=True, creds=CREDS, readonly_unsupported=False
    )
    assert (wiring.readonly_secret, wiring.readonly_access_key) == ("j-storage-readonly", "accessKey")
    assert issue is None


def test_issued_when_there_are_credentials_to_issue_with() -> None:
    wiring, issue = credentials.wiring(
        store(), {}, "j", issued_before=False, creds=CREDS, readonly_unsupported=False
    )
    assert wiring.readonly_secret == "j-storage-readonly"
    assert issue == CREDS


@pytest.mark.parametrize(("creds", "unsupported"), [(None, False), (CREDS, True)])
def test_otherwise_inference_pods_get_the_jobs_own_pair(
    creds: storage.Credentials | None, unsupported: bool
) -> None:
    wiring, issue = credentials.wiring(
        store(), {}, "j", issued_before=False, creds=creds, readonly_unsupported=unsupported
    )
    assert (wiring.secret, wiring.readonly_secret, issue) == ("creds", None, None)


def test_the_read_only_secret_holds_the_issued_pair_and_is_owned() -> None:
    owner = {"uid": "uid-1", "kind": "EchoJob", "name": "j"}
    secret = credentials.readonly_secret("j", "ml", owner, storage.Credentials("ro-key", "ro-secret"))
    assert secret["metadata"]["name"] == "j-storage-readonly"
    assert secret["metadata"]["namespace"] == "ml"
    assert secret["metadata"]["ownerReferences"] == [owner]
    assert secret["metadata"]["labels"][names.JOB] == "j"
    assert base64.b64decode(secret["data"]["accessKey"]) == b"ro-key"
    assert base64.b64decode(secret["data"]["secretKey"]) == b"ro-secret"
