"""What a test node leaves on the host, found and removed: processes, mounts, cgroups, sysctls.

The kubelet and containerd run in the host's mount, PID and cgroup namespaces (only the network is
the cluster's own), so they leave traces there: containerd shims outlive containerd, the kubelet
bind-mounts its root directory and pod volumes, every pod gets cgroup directories, and the kubelet
sets a few kernel sysctls (``vm.overcommit_memory``, ``kernel.panic``, ...). These helpers find each
kind of trace by what the cluster owns (a path prefix, a cgroup root, a socket address) and remove
it; :func:`leftovers` reports what is still there after a teardown, so a test can fail on it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

# What the kubelet writes (pkg/kubelet/cm: setupKernelTunables) and what kube-proxy may touch.
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls(names: Iterable[str] = SYSCTLS) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        with contextlib.suppress(OSError):
            out[name] = _sysctl_path(name).read_text().strip()
    return out


def restore_sysctls(saved: Mapping[str, str]) -> list[str]:
    """Write back ``saved``; return the names that could not be restored."""
    failed = []
    for name, value in saved.items():
        path = _sysctl_path(name)
        try:
            if path.read_text().strip() != value:
                path.write_text(value)
        except OSError:
            failed.append(name)
    return failed


# -- processes ---------------------------------------------------------------------------------


def processes_mentioning(needles: Sequence[str]) -> dict[int, str]:
    """PIDs (and command lines) of processes whose command line contains any of ``needles``."""
    found: dict[int, str] = {}
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmdline and any(n in cmdline for n in needles):
            found[int(entry.name)] = cmdline
    return found


def kill_all(pids: Iterable[int], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds, whatever is still alive."""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# -- mounts ------------------------------------------------------------------------------------


def mounts_under(prefixes: Sequence[Path]) -> list[str]:
    """Mount points (from /proc/self/mountinfo) at or below any of ``prefixes``, deepest first."""
    roots = [os.fspath(p).rstrip("/") for p in prefixes]
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].encode().decode("unicode_escape")
        if any(target == r or target.startswith(r + "/") for r in roots):
            found.append(target)
    return sorted(set(found), key=lambda t: (-t.count("/"), t))


def unmount_under(prefixes: Sequence[Path]) -> None:
    for _ in range(3):  # bind mounts can stack; a few rounds take them all
        targets = mounts_under(prefixes)
        if not targets:
            return
        for target in targets:
            if subprocess.run(["umount", target], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", target], capture_output=True, check=False)


# -- cgroups -----------------------------------------------------------------------------------


def cgroup_mounts() -> list[Path]:
    """Every mounted cgroup (v1 and v2) hierarchy."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split()[0] in ("cgroup", "cgroup2"):
            out.append(Path(pre.split()[4]))
    return out


def cgroup_dirs(names: Sequence[str]) -> list[Path]:
    """The directories ``<hierarchy>/<name>`` that exist, for every hierarchy and name."""
    return [m / n.strip("/") for m in cgroup_mounts() for n in names if (m / n.strip("/")).is_dir()]


def cgroup_tasks(names: Sequence[str]) -> set[int]:
    """PIDs in any cgroup below ``names``."""
    pids: set[int] = set()
    for top in cgroup_dirs(names):
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def remove_cgroups(names: Sequence[str]) -> None:
    """rmdir every cgroup below ``names``, children first (a cgroup dir is removed with rmdir)."""
    for top in cgroup_dirs(names):
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def leftovers(
    needles: Sequence[str],
    mount_prefixes: Sequence[Path],
    cgroups: Sequence[str],
    netns_paths: Sequence[Path],
    sysctls: Mapping[str, str],
) -> list[str]:
    """Everything of a cluster still on the host, one line each (empty: nothing is left)."""
    found = [f"process {pid}: {cmd[:200]}" for pid, cmd in processes_mentioning(needles).items()]
    found += [f"mount {m}" for m in mounts_under(mount_prefixes)]
    found += [f"cgroup {d}" for d in cgroup_dirs(cgroups)]
    found += [f"network namespace {p}" for p in netns_paths if p.exists()]
    now = read_sysctls(sysctls)
    found += [f"sysctl {k} = {now.get(k)} (was {v})" for k, v in sysctls.items() if now.get(k) != v]
    return found
