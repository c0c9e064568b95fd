"""Join tokens: one random token per role (the trainer and every pool), kept in ``<job>-<role>-join``.

A token is made once, when its Secret is missing, and never changes afterwards: the coordinator's
tokens file holds only SHA-256 digests (:func:`digests`), and a re-created Secret would lock out
every worker holding the old token. A Secret of that name that this job does not own is a
``NameConflict`` the user must resolve. The join Secrets of external pools also carry the address
external workers reach the coordinator at (:func:`external_url`): the EchoJob's
``echorl.dev/external-url`` annotation if set, else the external Service's load-balancer address.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from echo_operator import children, context, names
from echo_operator.kube import KubeError
from echo_runtime import spec

Object = dict[str, Any]


def external_url(annotations: Mapping[str, str], service: Mapping[str, Any] | None) -> str | None:
    """Where external workers reach the coordinator (None while no address is known)."""
    annotated = annotations.get(names.EXTERNAL_URL)
    if annotated:
        return str(annotated)
    ingress = ((service or {}).get("status", {}).get("loadBalancer", {}) or {}).get("ingress") or []
    if ingress:
        host = ingress[0].get("hostname") or ingress[0].get("ip")
        if host:
            return f"http://{host}:{names.COORDINATOR_PORT}"
    return None


def roles(resolved: spec.ResolvedJob) -> tuple[list[str], set[str]]:
    """(every role that needs a token, the roles of external pools)."""
    pools = resolved.inference_pools
    return ["trainer", names.STATUS_ROLE, *(p for p, _ in pools)], {p for p, s in pools if s.external}


def digests(tokens: Mapping[str, str]) -> dict[str, str]:
    """Role → hex SHA-256 of its token: all the coordinator's tokens file holds."""
    return {role: hashlib.sha256(token.encode()).hexdigest() for role, token in tokens.items()}


def address_patch(data: Mapping[str, str], url: str | None) -> Object | None:
    """The patch that puts ``url`` into a join Secret holding ``data`` (None: nothing to change)."""
    if url is None:
        return None
    encoded = base64.b64encode(url.encode()).decode()
    return None if data.get("coordinator") == encoded else {"data": {"coordinator": encoded}}


def ensure(
    ctx: context.Context,
    body: Mapping[str, Any],
    roles_: Sequence[str],
    external: set[str],
    url: str | None,
    existing: Mapping[tuple[str, str], Object],
) -> dict[str, str]:
    """Role → token, creating the Secrets that are missing and giving external ones the address."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    owner = context.owner(body)
    tokens: dict[str, str] = {}
    for role in roles_:
        secret_name = names.role_secret(name, role)
        role_url = url if role in external else None
        current = existing.get(("Secret", secret_name))
        if current is None:
            wanted = children.join_secret(name, namespace, owner, role, secrets.token_urlsafe(32), role_url)
            try:
                current = ctx.kube.create(wanted)
            except KubeError as exc:
                if not exc.conflict:
                    raise
                current = ctx.kube.get("v1", "Secret", namespace, secret_name)
                if current is None or not context.owned_by(current, meta["uid"]):
                    raise ctx.problem(
                        body,
                        "NameConflict",
                        f"Secret {secret_name} exists and does not belong to this EchoJob; rename the "
                        "job or the pool, or delete that Secret",
                    ) from None
        data = current.get("data") or {}
        patch = address_patch(data, role_url)
        if patch is not None:
            ctx.kube.merge_patch("v1", "Secret", namespace, secret_name, patch)
            ctx.events.post(
                body,
                "Normal",
                "ExternalAddressAssigned",
                f"external workers of pool {role} join through {role_url} (Secret {secret_name})",
            )
        tokens[role] = base64.b64decode(data["token"]).decode()
    return tokens
