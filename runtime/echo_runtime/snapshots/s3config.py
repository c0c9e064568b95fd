"""How to reach an S3 store: credentials, the endpoint's form, and transfer settings.

Credentials are looked up once, in a fixed order (explicit, ``ECHORL_S3_*``, ``AWS_*``), and the
source is remembered so an authentication error can say which credentials were rejected. Secrets
never appear in a ``repr``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from echo_runtime.snapshots import errors

MiB = 1024 * 1024
MIN_PART = 5 * MiB


@dataclasses.dataclass(frozen=True)
class Credentials:
    """An S3 access key and secret (and a session token for temporary credentials)."""

    access_key: str
    secret_key: str = dataclasses.field(repr=False)
    session_token: str | None = dataclasses.field(default=None, repr=False)


def credentials_from_env(env: Mapping[str, str] | None = None) -> tuple[Credentials | None, str]:
    """Credentials from ``ECHORL_S3_ACCESS_KEY``/``ECHORL_S3_SECRET_KEY``, else the ``AWS_*`` variables.

    Returns the credentials (None: anonymous) and where they came from, for error messages.
    """
    env = os.environ if env is None else env
    for key, secret, token in (
        ("ECHORL_S3_ACCESS_KEY", "ECHORL_S3_SECRET_KEY", "ECHORL_S3_SESSION_TOKEN"),
        ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    ):
        if env.get(key):
            if not env.get(secret):
                raise errors.StoreAuthError(f"${key} is set but ${secret} is not; set both")
            return Credentials(env[key], env[secret], env.get(token) or None), f"${key}/${secret}"
    return None, "none found (anonymous access); set $ECHORL_S3_ACCESS_KEY and $ECHORL_S3_SECRET_KEY"


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Transfer settings. The defaults fill a loopback or LAN link from a 2-core machine."""

    part_size: int = 16 * MiB
    """Multipart upload part and ranged-download part size; files above it are split."""
    parallel: int = 4
    """Parts of one file in flight at once."""
    lookahead: int = 8
    """Parts requested ahead of the one being verified (they wait in the page cache, not in memory)."""
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0

    def upload_part_size(self, size: int) -> int:
        """Multipart part size for a file of ``size`` bytes: ``part_size``, but small enough that a
        medium file still keeps every parallel slot busy twice over (S3's minimum is 5 MiB)."""
        return max(MIN_PART, min(self.part_size, -(-size // (2 * self.parallel))))

    def range_size(self, size: int) -> int:
        """Ranged-download part size for a file of ``size`` bytes: ``part_size``, or less so that a
        file of a few parts still spreads over every parallel slot."""
        return max(MIN_PART, min(self.part_size, -(-size // self.parallel)))

    def __post_init__(self) -> None:
        if self.part_size < MIN_PART:
            raise ValueError(f"part_size: S3 needs parts of at least 5 MiB, got {self.part_size}")
        if self.parallel < 1 or self.lookahead < self.parallel:
            raise ValueError("parallel: must be ≥ 1, and lookahead ≥ parallel")


def parse_endpoint(endpoint: str, secure: bool) -> tuple[str, bool]:
    """``host:port`` and whether to use TLS, from ``host:port`` or ``http(s)://host:port``."""
    if "://" not in endpoint:
        endpoint = ("https://" if secure else "http://") + endpoint
    parts = urlsplit(endpoint)
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or parts.path not in ("", "/")
        or parts.query
    ):
        raise ValueError(
            f"storage.endpoint: expected host:port or http(s)://host:port without a path, got {endpoint!r}"
        )
    return parts.netloc, parts.scheme == "https"
