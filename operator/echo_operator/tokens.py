"""Join tokens: one random token per role (the trainer and every pool), kept in ``<job>-<role>-join``.

A token is made once, when its Secret is missing, and never changes afterwards: the coordinator's
tokens file holds only SHA-256 digests (:func:`digests`), and a re-created Secret would lock out
every worker holding the old token. A Secret of that name that this job does not own is a
``NameConflict`` the user must resolve. The join Secrets of external pools also carry the address
external workers reach the coordinator at (:func:`external_url`): the EchoJob's
``echorl.dev/external-url`` annotation if set, else the external Service's load-balancer address on
the coordinator's TLS port. Through that Service they also carry the certificate to expect
(:func:`external_fields`: ``fingerprint`` and ``ca.crt``, :mod:`echo_operator.coordinator_tls`); an
annotated address (an Ingress) presents a certificate of its own, so there they are left out.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from echo_operator import context, names
from echo_operator.children import inputs, token_secrets
from echo_operator.kube import KubeError
from echo_runtime import spec

Object = dict[str, Any]


def external_url(
    annotations: Mapping[str, str], service: Mapping[str, Any] | None, tls: bool = False
) -> str | None:
    """Where external workers reach the coordinator (None while no address is known): the annotation,
    else ``https://<load balancer>:8443`` (``http://…:8700`` for a coordinator without TLS)."""
    annotated = annotations.get(names.EXTERNAL_URL)
    if annotated:
        return str(annotated)
    ingress = ((service or {}).get("status", {}).get("loadBalancer", {}) or {}).get("ingress") or []
    if ingress:
        host = ingress[0].get("hostname") or ingress[0].get("ip")
        if host:
            if ":" in host:  # an IPv6 address
                host = f"[{host}]"
            if tls:
                return f"https://{host}:{names.COORDINATOR_TLS_PORT}"
            return f"http://{host}:{names.COORDINATOR_PORT}"
    return None


def external_fields(
    annotations: Mapping[str, str], service: Mapping[str, Any] | None, tls: inputs.TLSWiring | None
) -> dict[str, str | None] | None:
    """The keys an external pool's join Secret carries beside its token (None: no address yet).

    A value of None means the key must be absent: an annotated address is not the coordinator's own
    certificate, so a pin left from before would refuse it.
    """
    url = external_url(annotations, service, tls is not None)
    if url is None:
        return None
    own = tls is not None and not annotations.get(names.EXTERNAL_URL)
    return {
        "coordinator": url,
        "fingerprint": tls.fingerprint if own and tls else None,
        "ca.crt": tls.ca if own and tls else None,
    }


def roles(resolved: spec.ResolvedJob) -> tuple[list[str], set[str]]:
    """(every role that needs a token, the roles of external pools)."""
    pools = resolved.inference_pools
    scorer = [names.SCORER_ROLE] if resolved.spec.reward_models else []
    return ["trainer", names.STATUS_ROLE, *scorer, *(p for p, _ in pools)], {
        p for p, s in pools if s.external
    }


def digests(tokens: Mapping[str, str]) -> dict[str, str]:
    """Role → hex SHA-256 of its token: all the coordinator's tokens file holds."""
    return {role: hashlib.sha256(token.encode()).hexdigest() for role, token in tokens.items()}


def address_patch(data: Mapping[str, str], fields: Mapping[str, str | None] | None) -> Object | None:
    """The merge patch that gives a join Secret holding ``data`` the ``fields`` (None: nothing to change)."""
    if fields is None:
        return None
    changes: dict[str, str | None] = {}
    for key, value in fields.items():
        encoded = None if value is None else base64.b64encode(value.encode()).decode()
        if data.get(key) != encoded:
            changes[key] = encoded
    return {"data": changes} if changes else None


def ensure(
    ctx: context.Context,
    body: Mapping[str, Any],
    roles_: Sequence[str],
    external: set[str],
    fields: Mapping[str, str | None] | None,
    existing: Mapping[tuple[str, str], Object],
) -> dict[str, str]:
    """Role → token, creating the Secrets that are missing and giving external ones the address
    (and the certificate to expect: :func:`external_fields`)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    owner = context.owner(body)
    tokens: dict[str, str] = {}
    for role in roles_:
        secret_name = names.role_secret(name, role)
        role_fields = fields if role in external else None
        current = existing.get(("Secret", secret_name))
        if current is None:
            wanted = token_secrets.join_secret(
                name, namespace, owner, role, secrets.token_urlsafe(32), role_fields
            )
            try:
                current = ctx.kube.create(wanted)
            except KubeError as exc:
                if not exc.conflict:
                    raise
                current = ctx.kube.get("v1", "Secret", namespace, secret_name)
                if current is None or not context.owned_by(current, meta["uid"]):
                    raise ctx.fault(
                        body,
                        "NameConflict",
                        f"Secret {secret_name} exists and does not belong to this EchoJob; rename the "
                        "job or the pool, or delete that Secret",
                    ) from None
        data = current.get("data") or {}
        patch = address_patch(data, role_fields)
        if patch is not None and role_fields is not None:
            ctx.kube.merge_patch("v1", "Secret", namespace, secret_name, patch)
            pinned = role_fields.get("fingerprint")
            ctx.events.post(
                body,
                "Normal",
                "ExternalAddressAssigned",
                f"external workers of pool {role} join through {role_fields['coordinator']}"
                + (f", certificate {pinned}" if pinned else "")
                + f" (Secret {secret_name})",
            )
        tokens[role] = base64.b64decode(data["token"]).decode()
    return tokens
