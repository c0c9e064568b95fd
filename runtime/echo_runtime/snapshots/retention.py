"""Which versions, pins and leftovers garbage collection removes: pure decisions, no I/O.

Rules (``SyncPolicy.retention``):

* the newest ``keep_last`` versions are kept (``keep_last ≥ 1``, so the newest version, the one the
  ``latest`` pointer names, is never removed);
* a version with a live pin is kept: a pin says "reader R still uses version v" and lives ``ttl_s``
  seconds after it was last written, so a reader that dies stops pinning once its pin expires;
* while a job runs, every version from ``keep_from`` on is kept too: the trainer collects with
  ``keep_from`` the oldest version a worker may still generate with or be told to load (its version
  minus the staleness bound), so a worker that cannot pin (a read-only credential) or has not pinned
  yet never loses the version it was sent for;
* every other version is removed; so are expired pins;
* a ``data-*`` folder that no manifest names (a publish that was killed, or lost a race) is removed
  once it is older than a grace period, so a publish still uploading is never touched.

Times are seconds on the *store's* clock (object modification times and the server's ``Date``), so a
reader whose own clock is wrong cannot make its pin live longer or shorter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping


@dataclasses.dataclass(frozen=True)
class Pin:
    """Reader ``reader`` uses ``version``; the pin was last written at ``since`` for ``ttl_s`` seconds."""

    version: int
    reader: str
    ttl_s: int
    since: float

    @property
    def expires_at(self) -> float:
        return self.since + self.ttl_s

    def live(self, now: float) -> bool:
        return self.expires_at > now


@dataclasses.dataclass(frozen=True)
class Plan:
    """The outcome of :func:`plan`. Version tuples are sorted ascending."""

    keep: tuple[int, ...]
    delete: tuple[int, ...]
    pinned: tuple[int, ...]
    """Versions kept only because a live pin holds them (a subset of ``keep``)."""
    expired_pins: tuple[Pin, ...]
    needed: tuple[int, ...] = ()
    """Versions kept only because a kept delta version is rebuilt from them (a subset of ``keep``)."""
    in_use: tuple[int, ...] = ()
    """Versions kept only because they are at or after ``keep_from`` (a subset of ``keep``)."""


def plan(
    versions: Iterable[int],
    keep_last: int,
    pins: Iterable[Pin] = (),
    now: float = 0.0,
    needs: Mapping[int, int] | None = None,
    keep_from: int | None = None,
) -> Plan:
    """Decide which ``versions`` to keep and delete, and which ``pins`` have expired at ``now``.

    ``needs``: version → the oldest version reading it needs (a delta version needs every version back
    to its anchor, :mod:`.deltas`); a version kept for the newest or a pin keeps those too, counted
    in ``needed``. ``keep_from``: every version at or after it is kept (counted in ``in_use``)."""
    if keep_last < 1:
        raise ValueError(f"keep_last: must be ≥ 1 (the newest version is always kept), got {keep_last}")
    ordered = sorted(set(versions))
    newest = set(ordered[-keep_last:])
    pins = tuple(pins)
    held = {p.version for p in pins if p.live(now)}
    in_use = {v for v in ordered if keep_from is not None and v >= keep_from}
    wanted = newest | held | in_use
    chains = [(min(needs.get(v, v), v), v) for v in wanted] if needs else []
    needed = {u for u in ordered if u not in wanted and any(lo <= u < hi for lo, hi in chains)}
    keep = tuple(v for v in ordered if v in wanted or v in needed)
    return Plan(
        keep=keep,
        delete=tuple(v for v in ordered if v not in keep),
        needed=tuple(v for v in keep if v in needed),
        pinned=tuple(v for v in keep if v not in newest and v in held),
        in_use=tuple(v for v in keep if v not in newest and v not in held and v in in_use),
        expired_pins=tuple(sorted((p for p in pins if not p.live(now)), key=lambda p: (p.version, p.reader))),
    )


@dataclasses.dataclass(frozen=True)
class DataDir:
    """One ``data-*`` folder of a version, and the newest modification time among its objects."""

    version: int
    data: str
    modified: float


def orphans(
    data_dirs: Iterable[DataDir], owners: Mapping[int, str], now: float, grace_s: float
) -> tuple[DataDir, ...]:
    """The data folders no manifest names (``owners``: version → the folder its manifest names) and
    that nothing has written to for at least ``grace_s`` seconds."""
    if grace_s < 0:
        raise ValueError(f"grace_s: must be ≥ 0, got {grace_s}")
    return tuple(
        sorted(
            (d for d in data_dirs if owners.get(d.version) != d.data and d.modified + grace_s <= now),
            key=lambda d: (d.version, d.data),
        )
    )
