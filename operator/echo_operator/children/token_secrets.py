"""The Secrets of a job's tokens: the coordinator's tokens file and the join-token Secrets.

Promises: the coordinator's ``<job>-tokens`` Secret holds SHA-256 digests only (docs/contracts.md),
never a token; join-token Secrets hold random tokens, so they are made by :func:`join_secret` from a
token the caller generated, not by :func:`echo_operator.children.desired`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from echo_operator import names
from echo_operator.children import inputs, pods

Object = dict[str, Any]


def tokens_file(job: inputs.JobInput) -> str:
    """The coordinator's ``--tokens-file``: ``sha256:<hex>`` per role, so it never holds a token."""
    data = {
        "trainer": f"sha256:{job.token_digests['trainer']}",
        "pools": {p.name: f"sha256:{job.token_digests[p.name]}" for p in job.pools},
    }
    if names.STATUS_ROLE in job.token_digests:
        data["status"] = f"sha256:{job.token_digests[names.STATUS_ROLE]}"
    return yaml.safe_dump(data, sort_keys=False)


def tokens_secret(job: inputs.JobInput) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": pods.object_meta(job, names.tokens_secret(job.name), "join-token"),
        "type": "Opaque",
        "data": {"tokens.yaml": pods.b64(tokens_file(job))},
    }


def join_secret(
    job_name: str,
    namespace: str,
    owner: Object,
    role: str,
    token: str,
    external: Mapping[str, str | None] | None = None,
) -> Object:
    """A join token Secret (``<job>-<role>-join``, key ``token``; for an external pool also
    ``coordinator``, ``fingerprint`` and ``ca.crt`` when known), or the status token's
    (``<job>-status-token``)."""
    data = {"token": pods.b64(token)}
    for key, value in (external or {}).items():
        if value is not None:
            data[key] = pods.b64(value)
    labels = names.labels(job_name, "join-token", None if role in ("trainer", names.STATUS_ROLE) else role)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": names.role_secret(job_name, role),
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "type": "Opaque",
        "data": data,
    }
