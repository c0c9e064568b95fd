"""Network namespaces the test run creates itself, and what their insides look like.

The test cluster lives in one (``notes/kubernetes-node.md``, "Containment"): it has ``lo`` with the
node's address, routes for the cluster's own ranges, and nothing that leads out. Every process that
talks to the cluster is started through :meth:`NetNamespace.argv`, i.e. ``nsenter --net=...``, which
switches only the network namespace. (``ip netns exec`` would also make a private mount namespace and
remount ``/sys``, hiding the cgroup mounts the kubelet needs.)

:func:`describe` reads a namespace's links and routes (``ip -json``), and :func:`leaks` says which of
them could carry traffic out, for the containment test and for a check the cluster runs on itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.procs import ServiceError

NETNS_DIR = Path("/run/netns")
NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise ServiceError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


@dataclasses.dataclass(frozen=True)
class NetNamespace:
    """A named network namespace (``/run/netns/<name>``)."""

    name: str

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    def exists(self) -> bool:
        return self.path.exists()

    def argv(self, argv: Sequence[str | os.PathLike[str]]) -> list[str]:
        """``argv`` run inside this namespace (network only; mounts, PIDs and cgroups stay the host's)."""
        return [NSENTER, f"--net={self.path}", "--", *(os.fspath(a) for a in argv)]

    def run(
        self, argv: Sequence[str | os.PathLike[str]], check: bool = True, timeout: float = 60.0, **kw: Any
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.argv(argv), capture_output=True, text=True, timeout=timeout, check=False, **kw
        )
        if check and proc.returncode != 0:
            raise ServiceError(
                f"in netns {self.name}: {' '.join(map(str, argv))} failed ({proc.returncode}):\n"
                f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
            )
        return proc

    def ip_json(self, *args: str) -> Any:
        return json.loads(_ip("-json", *args, netns=self.name).stdout or "[]")


def create(name: str, addresses: Sequence[str] = (), lo_routes: Sequence[str] = ()) -> NetNamespace:
    """Create ``name`` with ``lo`` up, ``addresses`` (CIDR) on ``lo`` and ``lo_routes`` routed to ``lo``.

    Nothing else: no default route, no link to the host. A route on ``lo`` makes a range "reachable"
    so that ``connect()`` gets as far as the NAT rules (kube-proxy's Service addresses); anything not
    DNATed there stays on the namespace's own loopback.
    """
    ns = NetNamespace(name)
    if ns.exists():
        raise ServiceError(f"network namespace {name} exists already")
    _ip("netns", "add", name)
    try:
        _ip("link", "set", "lo", "up", netns=name)
        for address in addresses:
            _ip("addr", "add", address, "dev", "lo", netns=name)
        for route in lo_routes:
            _ip("route", "add", route, "dev", "lo", netns=name)
    except BaseException:
        delete(ns)
        raise
    return ns


def delete(ns: NetNamespace) -> None:
    if ns.exists():
        _ip("netns", "delete", ns.name, check=False)


# ---------------------------------------------------------------------------------------------
# Containment


@dataclasses.dataclass(frozen=True)
class Link:
    name: str
    index: int
    kind: str
    """``loopback``, ``veth``, ``bridge``, ... (``ip -d`` link info kind; ``loopback`` for lo)."""
    peer_netnsid: int | None
    """For a veth: the namespace id (in this namespace's id space) of the other end, None if here."""
    peer_index: int | None


@dataclasses.dataclass(frozen=True)
class Inside:
    """What one namespace holds that could carry traffic."""

    links: tuple[Link, ...]
    routes: tuple[dict[str, Any], ...]
    """Every route of every table (``ip route show table all``)."""
    netnsids: dict[int, str | None]
    """Namespace ids this namespace knows, with the name under /run/netns if it has one."""


def describe(run_ip: Any) -> Inside:
    """Read links, routes and namespace ids through ``run_ip(*args) -> json`` (any namespace)."""
    links = []
    for entry in run_ip("-d", "link", "show"):
        kind = (
            "loopback"
            if entry.get("link_type") == "loopback"
            else entry.get("linkinfo", {}).get("info_kind", "")
        )
        netnsid = entry.get("link_netnsid")
        links.append(
            Link(
                entry["ifname"],
                int(entry["ifindex"]),
                kind,
                int(netnsid) if netnsid is not None else None,
                entry.get("link_index"),
            )
        )
    routes = tuple(run_ip("route", "show", "table", "all")) + tuple(
        run_ip("-6", "route", "show", "table", "all")
    )
    ids = {int(e["nsid"]): e.get("name") for e in run_ip("netns", "list-id")}
    return Inside(tuple(links), routes, ids)


def is_default(route: dict[str, Any]) -> bool:
    return route.get("dst") in ("default", "0.0.0.0/0", "::/0")


def leaks(
    inside: Inside, allowed_veths: set[str], allow_default_via: frozenset[str] | set[str] = frozenset()
) -> list[str]:
    """Why ``inside`` could reach outside: default routes, and links other than lo or ``allowed_veths``.

    ``allowed_veths`` are veths whose other end is known to be in a namespace the test run made;
    ``allow_default_via`` names the links a default route may use (a pod's veth to the node).
    """
    found: list[str] = []
    for route in inside.routes:
        if is_default(route) and route.get("dev") not in allow_default_via:
            found.append(f"default route: {route}")
    for link in inside.links:
        if link.kind == "loopback":
            continue
        if link.kind == "veth" and link.name in allowed_veths:
            continue
        where = "" if link.peer_netnsid is None else f" (other end in namespace id {link.peer_netnsid})"
        found.append(f"link {link.name} of kind {link.kind or 'unknown'}{where}")
    return found
