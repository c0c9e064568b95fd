"""Join tokens and worker sessions: who may call what.

* One join token per inference pool and one for the trainer (docs/contracts.md). The coordinator keeps
  only their SHA-256 digests; a token is checked by hashing it and comparing digests with
  :func:`hmac.compare_digest` (constant time), against every stored digest when the role is not known
  in advance, so the time taken does not say which digest came close.
* A worker authenticates with its pool's token (``Authorization: Bearer <token>``) *and* the session key
  its registration returned (``X-Echo-Session``), also stored hashed. A member of a pool therefore
  cannot act for another worker of the same pool, even knowing its id from the status document.

The tokens file (``--tokens-file``) is YAML or JSON::

    trainer: <token>                 # or sha256:<64 hex digits>
    pools:
      cpu: <token>
      macs: sha256:5e88...
    status: <token>                  # optional: may read /v1/status and /metrics, nothing else

Plain tokens are hashed on load and the plain text is not kept. A plain token must have at least
:data:`MIN_TOKEN_CHARS` characters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

MIN_TOKEN_CHARS = 16
_HASHED = re.compile(r"^sha256:([0-9a-f]{64})$")


def digest(secret: str) -> bytes:
    """SHA-256 of a token or session key."""
    return hashlib.sha256(secret.encode("utf-8", errors="surrogatepass")).digest()


def matches(secret: str | None, stored: bytes | None) -> bool:
    """True if ``secret`` hashes to ``stored`` (constant-time comparison of the digests)."""
    if secret is None or stored is None:
        return False
    return hmac.compare_digest(digest(secret), stored)


def new_secret() -> str:
    """A fresh random token or session key (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def bearer(header: str | None) -> str | None:
    """The token in an ``Authorization: Bearer <token>`` header."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class TokenError(ValueError):
    """A tokens file or mapping is unusable; the message says which entry and why."""


@dataclasses.dataclass(frozen=True)
class TokenStore:
    """The digests of the trainer's and each pool's join token, and of the read-only status token."""

    trainer: bytes
    pools: Mapping[str, bytes]
    status: bytes | None = None
    """A token that may read the status document and the metrics only (what the operator uses)."""

    @classmethod
    def from_mapping(cls, data: Any, source: str = "tokens") -> TokenStore:
        """Build from ``{"trainer": ..., "pools": {name: ...}}``; values are tokens or ``sha256:<hex>``."""
        if not isinstance(data, Mapping):
            raise TokenError(f"{source}: must be a mapping with keys 'trainer' and 'pools'")
        unknown = sorted(set(data) - {"trainer", "pools", "status"})
        if unknown:
            raise TokenError(
                f"{source}: unknown key(s) {', '.join(map(str, unknown))}; allowed: trainer, pools, status"
            )
        if "trainer" not in data:
            raise TokenError(f"{source}: 'trainer' is missing")
        pools = data.get("pools") or {}
        if not isinstance(pools, Mapping) or not pools:
            raise TokenError(f"{source}: 'pools' must map each inference pool's name to its token")
        return cls(
            trainer=_stored(data["trainer"], f"{source}: trainer"),
            pools={str(name): _stored(value, f"{source}: pools.{name}") for name, value in pools.items()},
            status=_stored(data["status"], f"{source}: status") if data.get("status") is not None else None,
        )

    @classmethod
    def load(cls, path: str | Path) -> TokenStore:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise TokenError(f"{path}: cannot read: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise TokenError(f"{path}: not valid YAML/JSON: {exc}") from exc
        return cls.from_mapping(data, str(path))

    def is_trainer(self, token: str | None) -> bool:
        return matches(token, self.trainer)

    def is_status(self, token: str | None) -> bool:
        """True if ``token`` is the read-only status token (False when there is none, in the same time)."""
        return matches(token, self.status if self.status is not None else b"\0" * 32)

    def is_pool(self, pool: str, token: str | None) -> bool:
        """True if ``token`` is ``pool``'s join token (False for an unknown pool, in the same time)."""
        return matches(token, self.pools.get(pool, b"\0" * 32))

    def is_known(self, token: str | None) -> bool:
        """True if ``token`` is any of the job's tokens (compares against all of them); what it may do is
        checked by role afterwards, so the status token gets no further than the status endpoints."""
        if token is None:
            return False
        found = digest(token)
        hit = False
        status = () if self.status is None else (self.status,)
        for stored in (self.trainer, *self.pools.values(), *status):
            hit |= hmac.compare_digest(found, stored)
        return hit

    def missing_pools(self, pools: Iterable[str]) -> list[str]:
        """The job's pools that have no token here."""
        return [p for p in pools if p not in self.pools]


def generate(pools: Iterable[str]) -> dict[str, Any]:
    """Fresh plain tokens for a trainer and ``pools``, in the tokens-file shape (for ``echorl run``)."""
    return {"trainer": new_secret(), "pools": {p: new_secret() for p in pools}}


def _stored(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise TokenError(f"{where}: must be a string (a token or sha256:<64 hex digits>)")
    hashed = _HASHED.match(value)
    if hashed:
        return bytes.fromhex(hashed.group(1))
    if value.startswith("sha256:"):
        raise TokenError(f"{where}: a hashed token is 'sha256:' followed by 64 lowercase hex digits")
    if len(value) < MIN_TOKEN_CHARS:
        raise TokenError(f"{where}: a token needs at least {MIN_TOKEN_CHARS} characters, got {len(value)}")
    return digest(value)
