"""The TLS certificate a job's coordinator serves to workers outside the cluster.

A job with external pools exposes its coordinator through ``<job>-coordinator-external``, whose only
port is the coordinator's TLS port (:data:`names.COORDINATOR_TLS_PORT`); in-cluster pods keep the plain
port of ``<job>-coordinator``. The certificate comes from one of two places:

* **issued by the operator** (the default): Secret ``<job>-coordinator-tls`` (type ``kubernetes.io/tls``)
  holds a CA of the job's own (``ca.crt``, ``ca.key``) and the coordinator's certificate under it
  (``tls.crt``, ``tls.key``, ECDSA P-256). The CA is made once, like the join tokens, and kept for the
  job's life. The coordinator's certificate is re-issued under the same CA when the names it must carry
  change (a load balancer's address arrives) or it has less than :data:`RENEW_BEFORE` left; its
  fingerprint is in the coordinator pod's spec hash, so the coordinator restarts with it. The
  coordinator's pod mounts only ``tls.crt`` and ``tls.key``, never the CA's key.
* **someone else's** (cert-manager): the EchoJob annotation ``echorl.dev/coordinator-tls-secret: NAME``
  names a ``kubernetes.io/tls`` Secret in the job's namespace (``tls.crt``, ``tls.key``, optionally
  ``ca.crt``) that a Certificate keeps; the operator mounts it and issues nothing.

Either way the join Secrets of external pools carry ``fingerprint`` (``sha256:`` of the certificate the
coordinator serves) and ``ca.crt`` beside the https address, so ``echorl operator join`` can pin it.

Everything but :func:`ensure` is pure: the same inputs give the same decision.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from echo_operator import context, names
from echo_operator.children import inputs
from echo_operator.kube import KubeError
from echo_runtime.coordinator import tls as runtime_tls

Object = dict[str, Any]

CA_DAYS = 3650
LEAF_DAYS = 365
RENEW_BEFORE = datetime.timedelta(days=30)
_BACKDATE = datetime.timedelta(minutes=5)  # clocks of workers a little behind still accept it


# -- pure decisions ------------------------------------------------------------------------------


def hosts(
    job: str, namespace: str, annotations: Mapping[str, str], service: Mapping[str, Any] | None
) -> tuple[str, ...]:
    """The names and addresses the coordinator's certificate must carry, sorted.

    The external Service's DNS names, the load balancer's addresses once it has them, the Service's
    ``externalIPs``, and the host of ``echorl.dev/external-url`` when set.
    """
    svc = names.coordinator_external(job)
    out = {svc, f"{svc}.{namespace}", f"{svc}.{namespace}.svc", f"{svc}.{namespace}.svc.cluster.local"}
    status = ((service or {}).get("status") or {}).get("loadBalancer") or {}
    for ingress in status.get("ingress") or []:
        out.update(v for v in (ingress.get("ip"), ingress.get("hostname")) if v)
    out.update(((service or {}).get("spec") or {}).get("externalIPs") or [])
    annotated = annotations.get(names.EXTERNAL_URL)
    if annotated:
        host = urllib.parse.urlsplit(annotated).hostname
        if host:
            out.add(host)
    return tuple(sorted(out))


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def certificate_hosts(cert: x509.Certificate) -> tuple[str, ...]:
    """The DNS names and IP addresses a certificate names (sorted)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    found = [
        *san.get_values_for_type(x509.DNSName),
        *(str(a) for a in san.get_values_for_type(x509.IPAddress)),
    ]
    return tuple(sorted(found))


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def issue_ca(job: str, namespace: str, now: datetime.datetime) -> tuple[str, str]:
    """(CA certificate PEM, its key PEM): a CA of one job's own, for :data:`CA_DAYS`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Echo"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"echorl CA {namespace}/{job}"[:64]),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def issue_leaf(
    ca_pem: str, ca_key_pem: str, hosts_: Sequence[str], now: datetime.datetime
) -> tuple[str, str]:
    """(certificate PEM, key PEM) for the coordinator under the CA, naming ``hosts_``, for :data:`LEAF_DAYS`."""
    if not hosts_:
        raise ValueError("a coordinator certificate needs at least one name")
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA's key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts_[0][:64])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + datetime.timedelta(days=LEAF_DAYS), ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts_]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def fingerprint(cert_pem: str) -> str:
    """``sha256:<hex>`` of the (first) certificate in ``cert_pem``, as workers pin it."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    return runtime_tls.fingerprint(cert.public_bytes(serialization.Encoding.DER))


def leaf_problem(data: Mapping[str, str], hosts_: Sequence[str], now: datetime.datetime) -> str | None:
    """Why the coordinator certificate in ``data`` (decoded Secret data) must be re-issued (None: keep it)."""
    if not data.get("tls.crt") or not data.get("tls.key"):
        return "no certificate yet"
    try:
        cert = x509.load_pem_x509_certificate(data["tls.crt"].encode())
        ca = x509.load_pem_x509_certificate(data["ca.crt"].encode())
    except (KeyError, ValueError):
        return "the certificate cannot be read"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "the certificate is not signed by the job's CA"
    have = certificate_hosts(cert)
    if tuple(sorted(hosts_)) != have:
        return f"the names it must carry changed ({', '.join(have)} → {', '.join(sorted(hosts_))})"
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return f"it expires at {cert.not_valid_after_utc.isoformat()}"
    return None


def ca_usable(data: Mapping[str, str], now: datetime.datetime) -> bool:
    """Whether ``data`` holds a CA certificate and key that can sign for another year."""
    try:
        ca = x509.load_pem_x509_certificate(data["ca.crt"].encode())
        key = serialization.load_pem_private_key(data["ca.key"].encode(), password=None)
    except (KeyError, ValueError, TypeError):
        return False
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != ca.public_key():
        return False
    return ca.not_valid_after_utc - now > datetime.timedelta(days=LEAF_DAYS) + RENEW_BEFORE


def issued_data(
    data: Mapping[str, str], hosts_: Sequence[str], job: str, namespace: str, now: datetime.datetime
) -> tuple[dict[str, str], str] | None:
    """The Secret data to write and why, or None when ``data`` (decoded) is fine as it is.

    The CA stays as long as it is usable (workers holding ``ca.crt`` keep trusting the coordinator);
    only then is a new one made, and the coordinator's certificate with it.
    """
    out = dict(data)
    why = None
    if not ca_usable(data, now):
        out["ca.crt"], out["ca.key"] = issue_ca(job, namespace, now)
        why = "new CA" if not data.get("ca.crt") else "the CA could not sign any more"
    reason = leaf_problem(out, hosts_, now)
    if reason is None and why is None:
        return None
    out["tls.crt"], out["tls.key"] = issue_leaf(out["ca.crt"], out["ca.key"], hosts_, now)
    return out, why or reason or ""


def decode(secret: Mapping[str, Any] | None) -> dict[str, str]:
    data = (secret or {}).get("data") or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def secret_object(job: str, namespace: str, owner: Object, data: Mapping[str, str]) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": names.coordinator_tls(job),
            "namespace": namespace,
            "labels": names.labels(job, "coordinator"),
            "ownerReferences": [owner],
        },
        "type": "kubernetes.io/tls",
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())},
    }


def provided_problem(name: str, data: Mapping[str, str]) -> str | None:
    """What is wrong with a user's TLS Secret (None: usable)."""
    missing = [k for k in ("tls.crt", "tls.key") if not data.get(k)]
    if missing:
        return (
            f"Secret {name} has no {' or '.join(missing)} (a kubernetes.io/tls Secret, e.g. cert-manager's)"
        )
    try:
        x509.load_pem_x509_certificate(data["tls.crt"].encode())
    except ValueError:
        return f"Secret {name}: tls.crt is not a PEM certificate"
    return None


# -- the cluster ---------------------------------------------------------------------------------


def ensure(
    ctx: context.Context,
    body: Mapping[str, Any],
    hosts_: Sequence[str],
    existing: Mapping[tuple[str, str], Object],
) -> inputs.TLSWiring:
    """The coordinator's TLS wiring: the user's Secret, or the operator's, issued or renewed as needed."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    provided = (meta.get("annotations") or {}).get(names.TLS_SECRET)
    if provided:
        data = decode(ctx.kube.get("v1", "Secret", namespace, provided))
        if not data:
            raise ctx.fault(
                body,
                "TLSSecretMissing",
                f"Secret {provided} (annotation {names.TLS_SECRET}) does not exist in namespace {namespace}",
            )
        problem = provided_problem(provided, data)
        if problem:
            raise ctx.fault(body, "TLSSecretInvalid", problem)
        return inputs.TLSWiring(provided, fingerprint(data["tls.crt"]), data.get("ca.crt") or None)

    secret_name = names.coordinator_tls(name)
    current = existing.get(("Secret", secret_name))
    data = decode(current)
    if current is not None and not context.owned_by(current, meta["uid"]):
        raise ctx.fault(
            body,
            "NameConflict",
            f"Secret {secret_name} exists and does not belong to this EchoJob; rename the job or delete it",
        )
    now = context.now()
    change = issued_data(data, hosts_, name, namespace, now)
    if change is not None:
        data, why = change
        wanted = secret_object(name, namespace, context.owner(body), data)
        try:
            if current is None:
                ctx.kube.create(wanted)
            else:
                ctx.kube.merge_patch("v1", "Secret", namespace, secret_name, {"data": wanted["data"]})
        except KubeError as exc:
            if not exc.conflict:
                raise
            # Another pass of ours made it a moment ago: use what it made.
            data = decode(ctx.kube.get("v1", "Secret", namespace, secret_name))
            if not data.get("tls.crt"):
                raise
        else:
            ctx.events.post(
                body,
                "Normal",
                "CertificateIssued",
                f"coordinator certificate {fingerprint(data['tls.crt'])} for {', '.join(hosts_)} "
                f"(Secret {secret_name}: {why})",
            )
    return inputs.TLSWiring(secret_name, fingerprint(data["tls.crt"]), data["ca.crt"])
