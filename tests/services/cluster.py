"""A real one-node Kubernetes cluster inside a network namespace of its own: the e2e tier's cluster.

:func:`start_cluster` creates a network namespace (``lo`` with the node address, routes for the
service range, nothing leading out: :mod:`services.netns`), and starts inside it, each through
``nsenter --net``: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (runc,
CNI ``ptp``), the kubelet, kube-proxy (iptables), CoreDNS (a process on the node address; the
kubelet's ``clusterDNS``) and kwok (simulated nodes, idle until a node with its annotation appears).
It imports the images ``scripts/images.sh`` built into containerd, waits until the node is Ready,
the ``default`` ServiceAccount exists, CoreDNS answers and kube-proxy has synced, and checks the
namespace's containment. Every component logs to ``<workdir>/logs/``.

:meth:`Cluster.stop` takes it all down in an order that leaves nothing behind (``notes/
kubernetes-node.md``): kubelet and node agents, then every pod sandbox (CNI teardown, network
namespaces), containerd and its shims, the control plane, then mounts, cgroups, the namespace and
the sysctls the kubelet changed; then :func:`services.hoststate.leftovers` must find nothing.

A cluster whose owner died (pytest killed) is cleaned up by the next :func:`start_cluster` or by
``scripts/cluster.sh down``, from the record it wrote under ``/run/echorl-clusters/``.

``python -m services.cluster up|down|status|kubectl ...`` (``scripts/cluster.sh``) runs the same
cluster for a person: ``up`` starts a supervisor process that owns it until ``down``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any, TypeVar

from services import cluster_files, hoststate, kube, netns
from services.procs import REPO_ROOT, ManagedProcess, ServiceError, log_tail

T = TypeVar("T")

NODE_NAME = "echorl-node"
ADMIN_USER = "echorl-test-admin"
REGISTRY = Path("/run/echorl-clusters")
IMAGES_SCRIPT = REPO_ROOT / "scripts" / "images.sh"
START_TIMEOUT_S = 180.0
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kubelet",
    "kube-proxy",
    "coredns",
    "kwok",
    "metrics-server",
)


def cache_root() -> Path:
    """Where images and containerd's image store are cached: ``$ECHORL_E2E_CACHE`` or ~/.cache/echorl.

    Like the test binaries' cache (and unlike the Python environment's ``$ECHORL_CACHE_DIR``) it is
    keyed by content and shared by every checkout on the machine: images are many GB.
    """
    return Path(
        os.environ.get("ECHORL_E2E_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "echorl"
    )


# ---------------------------------------------------------------------------------------------
# Running code inside the namespace


_CLONE_NEWNET = 0x40000000


class InNetns:
    """A thread that has joined the namespace: sockets it opens are the namespace's (setns is per thread).

    Used for the health checks of the start-up, which would otherwise spawn a process per poll.
    """

    def __init__(self, ns: netns.NetNamespace) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], futures.Future[Any]] | None] = queue.Queue()
        ready: futures.Future[None] = futures.Future()
        self._thread = threading.Thread(
            target=self._serve, args=(ns, ready), daemon=True, name=f"netns-{ns.name}"
        )
        self._thread.start()
        ready.result(timeout=10)

    def _serve(self, ns: netns.NetNamespace, ready: futures.Future[None]) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(ns.path, os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {ns.path}")
            finally:
                os.close(fd)
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(None)
        while (job := self._jobs.get()) is not None:
            fn, result = job
            try:
                result.set_result(fn())
            except BaseException as exc:
                result.set_exception(exc)

    def call(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        result: futures.Future[T] = futures.Future()
        self._jobs.put((fn, result))
        return result.result(timeout=timeout)

    def close(self) -> None:
        self._jobs.put(None)


def _http_ok(url: str, context: Any = None, expect: bytes | None = None) -> bool:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(url, timeout=2) as resp:
            body = resp.read()
            return bool(resp.status == 200 and (expect is None or expect in body))
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


# ---------------------------------------------------------------------------------------------
# PKI


@dataclasses.dataclass(frozen=True)
class ClusterPki:
    dir: Path

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    @property
    def ca(self) -> Path:
        return self.cert("ca")


# name -> (subject, extended key usage)
_CLIENTS = {
    "admin": (f"/O=system:masters/CN={ADMIN_USER}", "clientAuth"),
    "controller-manager": ("/CN=system:kube-controller-manager", "clientAuth"),
    "scheduler": ("/CN=system:kube-scheduler", "clientAuth"),
    "kubelet": (f"/O=system:nodes/CN=system:node:{NODE_NAME}", "clientAuth"),
    "kube-proxy": ("/CN=system:kube-proxy", "clientAuth"),
    "apiserver-kubelet": ("/CN=echorl-test:apiserver", "clientAuth"),
    "coredns": ("/CN=echorl-test:coredns", "clientAuth"),
    "kwok": ("/CN=echorl-test:kwok", "clientAuth"),
    "metrics-server": ("/CN=echorl-test:metrics-server", "clientAuth"),
    # The API server's identity when it proxies to an aggregated API (metrics-server): the one name
    # --requestheader-allowed-names trusts to assert a user in its X-Remote-User header.
    "front-proxy-client": ("/CN=front-proxy-client", "clientAuth"),
}


def make_pki(pki_dir: Path, addresses: cluster_files.Addresses) -> ClusterPki:
    """A CA, the API server's serving certificate, one client certificate per component, the SA key."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    pki = ClusterPki(pki_dir)
    kube.ec_key(pki.key("ca"), pki_dir)
    kube.openssl(
        "req", "-x509", "-new", "-key", pki.key("ca"), "-sha256", "-days", "7", "-subj", "/CN=echorl-e2e-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out", pki.ca, cwd=pki_dir,
    )  # fmt: skip
    leaf = "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    domain = addresses.cluster_domain
    sans = ",".join(
        [f"IP:{addresses.node_ip}", f"IP:{addresses.apiserver_service_ip}", "IP:127.0.0.1", "DNS:localhost"]
        + [
            f"DNS:{n}"
            for n in (
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                f"kubernetes.default.svc.{domain}",
            )
        ]
    )
    kube.signed_cert(
        pki_dir, "serving", "/CN=kube-apiserver",
        leaf + f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n", pki.ca, pki.key("ca"),
    )  # fmt: skip
    for name, (subject, usage) in _CLIENTS.items():
        kube.signed_cert(pki_dir, name, subject, leaf + f"extendedKeyUsage={usage}\n", pki.ca, pki.key("ca"))
    kube.ec_key(pki.key("sa"), pki_dir)
    kube.openssl("pkey", "-in", pki.key("sa"), "-pubout", "-out", pki.dir / "sa.pub", cwd=pki_dir)
    for p in pki_dir.glob("*.key"):
        p.chmod(0o600)
    return pki


# ---------------------------------------------------------------------------------------------
# The cluster


@dataclasses.dataclass
class Cluster:
    """A running cluster. Talk to it with :meth:`kubectl` (inside the namespace) or :meth:`run`."""

    ns: netns.NetNamespace
    workdir: Path
    bin_dir: Path
    addresses: cluster_files.Addresses
    pki: ClusterPki
    cgroup_root: str
    containerd_root: Path
    images: dict[str, str]
    """Image name (``operator``, ``worker-cpu``, ``trainer``, ``test-pause``, ...) → reference."""
    kwok_stages: Path
    record: Path
    processes: dict[str, ManagedProcess] = dataclasses.field(default_factory=dict)
    sysctls: dict[str, str] = dataclasses.field(default_factory=dict)
    startup_s: dict[str, float] = dataclasses.field(default_factory=dict)
    stopped: bool = False
    _inside: InNetns | None = None
    _lock_fd: int | None = None

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (``system:masters``); its server exists only inside the namespace."""
        return self.workdir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{self.addresses.node_ip}:{self.addresses.apiserver_port}"

    @property
    def runtime_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def node_name(self) -> str:
        return NODE_NAME

    # -- talking to it ---------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "HTTP_PROXY", "HTTPS_PROXY"))}
        env.update(KUBECONFIG=str(self.kubeconfig), HOME=str(self.workdir), NO_PROXY="*")
        return env

    def run(
        self,
        argv: Sequence[str | os.PathLike[str]],
        input: str | None = None,
        timeout: float = 120.0,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the cluster's network namespace with the admin kubeconfig in ``$KUBECONFIG``."""
        return self.ns.run(argv, check=check, timeout=timeout, input=input, env=self.env())

    def inside(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Call ``fn`` on a thread inside the cluster's network namespace: its sockets reach pod IPs and
        the namespace's loopback (a server the test started there), nothing outside."""
        if self._inside is None:
            raise ServiceError("the cluster is not started")
        return self._inside.call(fn, timeout=timeout)

    def kubectl(
        self, *args: str, input: str | None = None, timeout: float = 120.0, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """The built ``kubectl``, inside the namespace, as the admin (``check`` raises on failure)."""
        argv = [str(self.bin_dir / "kubectl"), f"--cache-dir={self.workdir / 'kubectl-cache'}", *args]
        proc = self.run(argv, input=input, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return proc

    def kubectl_json(self, *args: str) -> Any:
        proc = self.kubectl(*args, "-o", "json")
        if proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return json.loads(proc.stdout)

    def crictl(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """crictl against the node's containerd (a Unix socket: no network involved)."""
        sock = f"unix://{self.runtime_socket}"
        argv = [str(self.bin_dir / "crictl"), "--runtime-endpoint", sock, "--image-endpoint", sock, *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    def log(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"

    def describe_failure(self, what: str) -> str:
        tails = "\n".join(
            f"--- {name} ({p.log_path}) ---\n{log_tail(p.log_path, max_lines=15, max_chars=3000)}"
            for name, p in self.processes.items()
        )
        return f"test cluster in {self.workdir}: {what}\n{tails}"

    # -- containment -----------------------------------------------------------------------------
    def pod_netns(self) -> list[Path]:
        """The pod sandboxes' network namespaces (containerd keeps them under its state dir)."""
        root = self.workdir / "containerd" / "state" / "netns"
        return sorted(p for p in root.iterdir()) if root.is_dir() else []

    def containment(self) -> list[str]:
        """Every way out of the cluster's namespaces (empty when contained), see :func:`netns.leaks`.

        The node's namespace may hold ``lo`` and veths whose other end is a pod's ``eth0`` (matched
        by interface index both ways); a pod's namespace may hold ``lo`` and that one veth, and its
        default route goes through it, to the node's namespace, which has none.
        """
        node = netns.describe(self.ns.ip_json)
        pods: dict[Path, netns.Inside] = {}
        for path in self.pod_netns():

            def ip(*args: str, _path: Path = path) -> Any:
                argv = ["nsenter", f"--net={_path}", "--", "ip", "-json", *args]
                return json.loads(
                    subprocess.run(argv, capture_output=True, text=True, check=True).stdout or "[]"
                )

            pods[path] = netns.describe(ip)
        node_veths = {link.index: link for link in node.links if link.kind == "veth"}
        paired: set[str] = set()
        found: list[str] = []
        for path, pod in pods.items():
            veths = [link for link in pod.links if link.kind == "veth"]
            mine = {
                v.name
                for v in veths
                if v.peer_index in node_veths and node_veths[v.peer_index].peer_index == v.index
            }
            paired |= {
                node_veths[v.peer_index].name for v in veths if v.name in mine and v.peer_index is not None
            }
            found += [
                f"pod namespace {path.name}: {w}" for w in netns.leaks(pod, mine, allow_default_via=mine)
            ]
            if len(veths) > 1:
                found.append(f"pod namespace {path.name}: {len(veths)} veths")
        found += [f"node namespace: {w}" for w in netns.leaks(node, paired)]
        return found

    # -- stopping ---------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Take everything down; return what is left on the host (empty: nothing)."""
        if self.stopped:
            return []
        self.stopped = True
        errors: list[str] = []
        for name in ("metrics-server", "kwok", "kube-proxy", "coredns", "kubelet"):
            _stop(self.processes.get(name), errors)
        if (
            self.runtime_socket.exists()
            and self.processes.get("containerd")
            and self.processes["containerd"].running()
        ):
            pods = self.crictl("pods", "-q").stdout.split()
            for pod in pods:
                self.crictl("stopp", pod)
            if pods:
                self.crictl("rmp", "-f", *pods)
        _stop(self.processes.get("containerd"), errors)
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            _stop(self.processes.get(name), errors)
        if self._inside is not None:
            self._inside.close()
        cleanup(self._state())
        with contextlib.suppress(OSError):
            self.record.unlink()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        return errors + hoststate.leftovers(**_leftover_args(self._state()))

    def _state(self) -> dict[str, Any]:
        return {
            "owner": os.getpid(),
            "netns": self.ns.name,
            "workdir": str(self.workdir),
            "containerd_root": str(self.containerd_root),
            "cgroup_root": self.cgroup_root,
            "sysctls": self.sysctls,
        }


def _stop(proc: ManagedProcess | None, errors: list[str]) -> None:
    if proc is None:
        return
    try:
        proc.stop(grace=15.0)
    except Exception as exc:
        errors.append(f"stopping {proc.name}: {exc}")


def _leftover_args(state: dict[str, Any]) -> dict[str, Any]:
    workdir = Path(state["workdir"])
    return {
        "needles": [str(workdir)],
        "mount_prefixes": [workdir, Path(state["containerd_root"])],
        "cgroups": [state["cgroup_root"]],
        "netns_paths": [netns.NETNS_DIR / state["netns"]],
        "sysctls": state["sysctls"],
    }


def cleanup(state: dict[str, Any]) -> None:
    """Remove whatever a cluster (running or dead) left, from its record. Idempotent."""
    args = _leftover_args(state)
    # Pod processes live in the cluster's cgroups; the shims and every component mention its workdir.
    for _ in range(3):
        pids = set(hoststate.processes_mentioning(args["needles"])) | hoststate.cgroup_tasks(args["cgroups"])
        if not pids:
            break
        hoststate.kill_all(pids, grace=3.0)
    hoststate.unmount_under(args["mount_prefixes"])
    hoststate.remove_cgroups(args["cgroups"])
    netns.delete(netns.NetNamespace(state["netns"]))
    hoststate.restore_sysctls(state["sysctls"])
    _remove_log_links(Path(state["workdir"]))


def _remove_log_links(workdir: Path) -> None:
    """The kubelet links every container's log into /var/log/containers (a fixed path): unlink ours."""
    links = Path("/var/log/containers")
    if not links.is_dir():
        return
    for link in links.iterdir():
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link).startswith(str(workdir)):
                link.unlink()


def clean_stale() -> list[str]:
    """Clean up the clusters whose owner process is gone; return their namespace names."""
    cleaned = []
    if not REGISTRY.is_dir():
        return cleaned
    for record in sorted(REGISTRY.glob("*.json")):
        try:
            state = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if _pid_alive(int(state.get("owner", 0))):
            continue
        cleanup(state)
        record.unlink(missing_ok=True)
        cleaned.append(str(state["netns"]))
    return cleaned


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------------------------
# Starting


@dataclasses.dataclass
class ImagesBuild:
    """``scripts/images.sh`` running in the background; :meth:`wait` returns the image list it wrote."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, log_path: Path) -> ImagesBuild:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as err:
            proc = subprocess.Popen(
                ["bash", str(IMAGES_SCRIPT)],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        return cls(proc, log_path)

    def wait(self) -> Path:
        out, _ = self.proc.communicate()
        lines = out.decode().strip().splitlines()
        if self.proc.returncode != 0 or not lines:
            raise ServiceError(
                f"scripts/images.sh failed ({self.proc.returncode}) (log: {self.log_path}):\n"
                f"{log_tail(self.log_path, max_lines=40)}"
            )
        return Path(lines[-1])


def build_images(log_path: Path) -> Path:
    """Run ``scripts/images.sh`` (instant when cached); return the path of the image list it wrote."""
    return ImagesBuild.start(log_path).wait()


def _require_root() -> None:
    if os.geteuid() != 0:
        raise ServiceError(
            "the e2e test cluster needs root (network namespaces, containerd, the kubelet); "
            "deselect it with -m 'not e2e'"
        )
    missing = [
        b for b in ("containerd", "runc", "nsenter", "iptables", "ip", "ctr") if shutil.which(b) is None
    ]
    if missing or not Path("/usr/lib/cni/ptp").exists():
        raise ServiceError(
            f"missing {', '.join(missing) or 'CNI plugins in /usr/lib/cni'}: run scripts/hostpkgs.sh "
            "(scripts/test.sh does)"
        )


def start_cluster(
    bin_dir: Path,
    workdir: Path,
    image_list: Path,
    timeout: float = START_TIMEOUT_S,
    addresses: cluster_files.Addresses | None = None,
) -> Cluster:
    """Start the whole cluster under ``workdir`` (see the module docstring); raises :class:`ServiceError`."""
    _require_root()
    clean_stale()
    t0 = time.monotonic()
    addresses = addresses or cluster_files.Addresses()
    images = json.loads(image_list.read_text())
    ident = secrets.token_hex(3)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "logs").mkdir(exist_ok=True)
    containerd_root = cache_root() / "cluster" / "containerd"
    containerd_root.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(containerd_root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        raise ServiceError(
            f"another test cluster uses {containerd_root} (its images); stop it (scripts/cluster.sh down) "
            "or give this run another ECHORL_E2E_CACHE"
        ) from None
    ns = netns.create(
        f"echorl-e2e-{ident}",
        addresses=[f"{addresses.node_ip}/32"],
        lo_routes=[addresses.service_cidr],
    )
    REGISTRY.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(
        ns=ns,
        workdir=workdir,
        bin_dir=bin_dir,
        addresses=addresses,
        pki=ClusterPki(workdir / "pki"),
        cgroup_root=f"/echorl-e2e-{ident}",
        containerd_root=containerd_root,
        images=images,
        kwok_stages=bin_dir.parent / "kwok-stages",
        record=REGISTRY / f"{ns.name}.json",
        sysctls=hoststate.read_sysctls(),
        _lock_fd=lock_fd,
    )
    cluster.record.write_text(json.dumps(cluster._state()))
    try:
        _start(cluster, timeout, t0)
    except BaseException as exc:
        left = cluster.stop()
        if isinstance(exc, ServiceError) and left:
            raise ServiceError(f"{exc}\nand after stopping, left on the host: {left}") from exc
        raise
    cluster.startup_s["total"] = time.monotonic() - t0
    return cluster


def _proc(cluster: Cluster, name: str, argv: Sequence[str | os.PathLike[str]]) -> ManagedProcess:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "ETCD", "HTTP_PROXY", "HTTPS_PROXY"))
    }
    env["HOME"] = str(cluster.workdir)
    proc = ManagedProcess(name, cluster.ns.argv(argv), log_path=cluster.log(name), env=env).start()
    cluster.processes[name] = proc
    return proc


def _kubeconfig(cluster: Cluster, name: str) -> Path:
    pki = cluster.pki
    user = "admin" if name == "admin" else name
    return kube.write_kubeconfig(
        cluster.workdir / f"{name}.kubeconfig", cluster.server, pki.ca, pki.cert(user), pki.key(user), user
    )


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _start(cluster: Cluster, timeout: float, t0: float) -> None:
    w, a, b = cluster.workdir, cluster.addresses, cluster.bin_dir
    mark = time.monotonic()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        cluster.startup_s[name] = now - mark
        mark = now

    pki = make_pki(w / "pki", a)
    configs = {name: _kubeconfig(cluster, name) for name in ("admin", *(_CLIENTS.keys() - {"admin"}))}
    lap("pki")
    cluster._inside = inside = InNetns(cluster.ns)

    def healthy(proc: ManagedProcess, check: Callable[[], bool]) -> float:
        return proc.wait_healthy(lambda: inside.call(check, timeout=10), timeout, interval=0.25)

    # -- control plane ---------------------------------------------------------------------------
    etcd_dir = w / "etcd"
    etcd_dir.mkdir(mode=0o700, exist_ok=True)
    etcd = _proc(cluster, "etcd", [
        b / "etcd", "--name=node", f"--data-dir={etcd_dir}",
        "--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
        "--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
        "--initial-cluster=node=http://127.0.0.1:2380", "--unsafe-no-fsync=true", "--log-level=warn",
    ])  # fmt: skip
    healthy(etcd, lambda: _http_ok("http://127.0.0.1:2379/health", expect=b'"health":"true"'))
    lap("etcd")
    apiserver = _proc(cluster, "kube-apiserver", [
        b / "kube-apiserver", "--etcd-servers=http://127.0.0.1:2379",
        "--bind-address=0.0.0.0", f"--secure-port={a.apiserver_port}", f"--advertise-address={a.node_ip}",
        f"--cert-dir={w / 'apiserver-certs'}",
        f"--tls-cert-file={pki.cert('serving')}", f"--tls-private-key-file={pki.key('serving')}",
        f"--client-ca-file={pki.ca}", "--anonymous-auth=false",
        "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
        f"--service-account-issuer=https://kubernetes.default.svc.{a.cluster_domain}",
        f"--service-account-key-file={pki.dir / 'sa.pub'}", f"--service-account-signing-key-file={pki.key('sa')}",
        f"--service-cluster-ip-range={a.service_cidr}",
        f"--kubelet-client-certificate={pki.cert('apiserver-kubelet')}",
        f"--kubelet-client-key={pki.key('apiserver-kubelet')}",
        "--kubelet-preferred-address-types=InternalIP",
        "--allow-privileged=true", "--profiling=false", "--enable-priority-and-fairness=false", "--v=1",
        # The aggregation layer, for the resource metrics API the HPA controller reads (metrics-server).
        f"--requestheader-client-ca-file={pki.ca}", "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.cert('front-proxy-client')}",
        f"--proxy-client-key-file={pki.key('front-proxy-client')}", "--enable-aggregator-routing=true",
    ])  # fmt: skip
    ctx = _ssl_context(pki)
    healthy(apiserver, lambda: _http_ok(f"{cluster.server}/readyz", ctx, b"ok"))
    lap("kube-apiserver")
    cluster.kubectl("apply", "--server-side", "-f", "-", input=cluster_files.BOOTSTRAP_RBAC, check=True)
    cluster.kubectl(
        "apply", "--server-side", "-f", "-",
        input=cluster_files.METRICS_SERVER_RBAC + "\n---\n" + cluster_files.metrics_api(a), check=True,
    )  # fmt: skip
    for name, binary, port in (
        ("kube-controller-manager", "kube-controller-manager", 10257),
        ("kube-scheduler", "kube-scheduler", 10259),
    ):
        cfg = configs["controller-manager" if "controller" in name else "scheduler"]
        extra = (
            [f"--service-account-private-key-file={pki.key('sa')}", f"--root-ca-file={pki.ca}",
             "--use-service-account-credentials=true",
             # An HPA acts within seconds, not minutes: sync every 5 s and count a new pod's CPU
             # as soon as it is Ready (the defaults are 15 s, 5 min and 30 s).
             "--horizontal-pod-autoscaler-sync-period=5s",
             "--horizontal-pod-autoscaler-cpu-initialization-period=10s",
             "--horizontal-pod-autoscaler-initial-readiness-delay=5s"]
            if "controller" in name else []
        )  # fmt: skip
        _proc(cluster, name, [
            b / binary, f"--kubeconfig={cfg}", f"--authentication-kubeconfig={cfg}",
            f"--authorization-kubeconfig={cfg}", "--bind-address=127.0.0.1", f"--secure-port={port}",
            "--leader-elect=false", "--profiling=false", "--v=1", *extra,
        ])  # fmt: skip

    # -- node ------------------------------------------------------------------------------------
    sandbox = cluster.images["test-pause"]
    cni_dir = w / "cni" / "net.d"
    _write(cni_dir / "10-echorl-pods.conflist", cluster_files.cni_config(a, w / "cni" / "ipam"))
    containerd_conf = _write(
        w / "containerd" / "config.toml",
        cluster_files.containerd_config(
            cluster.containerd_root, w / "containerd" / "state", cluster.runtime_socket, cni_dir, sandbox
        ),
    )
    containerd = _proc(
        cluster, "containerd", ["containerd", "--config", containerd_conf, "--log-level", "warn"]
    )
    # Healthy means the CRI server answers, not only containerd's own API: the CRI plugin initialises
    # after the socket is up, and a kubelet that comes earlier exits ("server is not initialized yet").
    containerd.wait_healthy(
        lambda: cluster.crictl("pods", "-q", timeout=10).returncode == 0, timeout, interval=0.25
    )
    # Sandboxes a crashed earlier run left in the shared image store: remove them before the kubelet looks.
    stale = cluster.crictl("pods", "-q").stdout.split()
    if stale:
        cluster.crictl("rmp", "-f", *stale)
    lap("containerd")
    imported = subprocess.run(
        ["bash", str(IMAGES_SCRIPT), "import", str(cluster.runtime_socket), _image_list_path(cluster)],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    _write(cluster.log("images-import"), imported.stderr)
    if imported.returncode != 0:
        raise ServiceError(f"importing the images into containerd failed:\n{imported.stderr[-4000:]}")
    lap("images-import")
    kubelet_dir = w / "kubelet"
    kubelet_conf = _write(
        kubelet_dir / "config.yaml",
        cluster_files.kubelet_config(
            a, pki.ca, cluster.runtime_socket, cluster.cgroup_root, w / "pod-logs",
            _write(w / "resolv.conf", cluster_files.resolv_conf(a)),
        ),
    )  # fmt: skip
    # The kubelet also wants these outside its root dir by default: keep them in ours.
    kubelet_conf.write_text(kubelet_conf.read_text() + f"volumePluginDir: {kubelet_dir / 'volume-plugins'}\n")
    for hierarchy in hoststate.cgroup_mounts():  # the kubelet wants its cgroup root to exist
        (hierarchy / cluster.cgroup_root.strip("/")).mkdir(exist_ok=True)
    kubelet = _proc(cluster, "kubelet", [
        b / "kubelet", f"--config={kubelet_conf}", f"--kubeconfig={configs['kubelet']}",
        f"--root-dir={kubelet_dir / 'root'}", f"--cert-dir={kubelet_dir / 'pki'}",
        f"--node-ip={a.node_ip}", f"--hostname-override={NODE_NAME}", "--v=1",
    ])  # fmt: skip
    proxy_conf = _write(
        w / "kube-proxy.yaml", cluster_files.kube_proxy_config(a, configs["kube-proxy"], NODE_NAME)
    )
    proxy = _proc(cluster, "kube-proxy", [b / "kube-proxy", f"--config={proxy_conf}", "--v=1"])
    corefile = _write(w / "Corefile", cluster_files.corefile(a, configs["coredns"]))
    coredns = _proc(cluster, "coredns", [b / "coredns", "-conf", corefile])
    kwok_conf = _write(w / "kwok.yaml", cluster_files.kwok_config(sorted(cluster.kwok_stages.glob("*.yaml"))))
    _proc(cluster, "kwok", [
        b / "kwok", f"--kubeconfig={configs['kwok']}", f"--config={kwok_conf}",
        "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        f"--cidr={a.simulated_pod_cidr}", "--server-address=127.0.0.1:10247",
    ])  # fmt: skip
    # metrics-server scrapes the kubelet (real pods' CPU and memory) and serves metrics.k8s.io.
    ms = configs["metrics-server"]
    _proc(cluster, "metrics-server", [
        b / "metrics-server", f"--kubeconfig={ms}", f"--authentication-kubeconfig={ms}",
        f"--authorization-kubeconfig={ms}", f"--bind-address={a.node_ip}",
        f"--secure-port={cluster_files.METRICS_SERVER_PORT}", f"--cert-dir={w / 'metrics-server'}",
        "--kubelet-preferred-address-types=InternalIP", "--kubelet-insecure-tls",
        "--metric-resolution=10s", "--kubelet-request-timeout=5s", "--v=1",
    ])  # fmt: skip

    # -- ready -----------------------------------------------------------------------------------
    deadline = time.monotonic() + timeout
    _wait(
        cluster,
        deadline,
        "node Ready",
        lambda: (
            cluster.kubectl("wait", "--for=condition=Ready", f"node/{NODE_NAME}", "--timeout=5s").returncode
            == 0
        ),
        kubelet,
    )
    lap("node-ready")
    _wait(
        cluster,
        deadline,
        "the default ServiceAccount",
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", "default").returncode == 0,
    )
    healthy(proxy, lambda: _http_ok("http://127.0.0.1:10256/healthz"))
    healthy(coredns, lambda: _http_ok("http://127.0.0.1:8181/ready"))
    lap("services")
    # Until the aggregated API answers, discovery is incomplete and the namespace controller cannot
    # finish a deletion: the cluster is not ready before metrics.k8s.io is Available.
    available = ["get", "apiservice", "v1beta1.metrics.k8s.io", "-o"]
    available.append("jsonpath={.status.conditions[?(@.type=='Available')].status}")
    _wait(
        cluster,
        deadline,
        "the resource metrics API (metrics-server)",
        lambda: cluster.kubectl(*available).stdout.strip() == "True",
    )
    lap("metrics-api")
    leaks = cluster.containment()
    if leaks:
        raise ServiceError(cluster.describe_failure(f"the namespace is not contained: {leaks}"))


def _image_list_path(cluster: Cluster) -> str:
    path = cluster.workdir / "images.json"
    path.write_text(json.dumps(cluster.images))
    return str(path)


def _wait(
    cluster: Cluster,
    deadline: float,
    what: str,
    check: Callable[[], bool],
    proc: ManagedProcess | None = None,
) -> None:
    while not check():
        for name, p in cluster.processes.items():
            if not p.running():
                raise ServiceError(cluster.describe_failure(f"{name} exited while waiting for {what}"))
        if time.monotonic() > deadline:
            raise ServiceError(cluster.describe_failure(f"timed out waiting for {what}"))
        time.sleep(0.5)


def _ssl_context(pki: ClusterPki) -> Any:
    import ssl

    ctx = ssl.create_default_context(cafile=str(pki.ca))
    ctx.load_cert_chain(str(pki.cert("admin")), str(pki.key("admin")))
    return ctx


# ---------------------------------------------------------------------------------------------
# scripts/cluster.sh: the same cluster for a person


def _state_dir(name: str) -> Path:
    return Path(os.environ.get("ECHORL_CLUSTER_DIR", f"/tmp/echorl-cluster-{name}"))


def _serve(name: str) -> int:
    """The supervisor: start the cluster, write ``ready.json``, hold it until SIGTERM, stop it."""
    from services import procs

    state = _state_dir(name)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        bin_dir = procs.run_testbin(log_path=state / "testbin.log")
        image_list = build_images(state / "images.log")  # in the foreground: nothing else to overlap
        cluster = start_cluster(bin_dir, state / "cluster", image_list)
    except Exception as exc:
        _write(state / "failed.txt", str(exc))
        return 1
    info = {
        "netns": cluster.ns.name,
        "kubeconfig": str(cluster.kubeconfig),
        "kubectl": str(bin_dir / "kubectl"),
        "server": cluster.server,
        "images": cluster.images,
        "startup_s": cluster.startup_s,
        "supervisor": os.getpid(),
    }
    _write(state / "ready.json", json.dumps(info, indent=2))
    stop.wait()
    left = cluster.stop()
    _write(state / "stopped.txt", "\n".join(left) or "nothing left")
    (state / "ready.json").unlink(missing_ok=True)
    return 0 if not left else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else "status"
    name = os.environ.get("ECHORL_CLUSTER_NAME", "dev")
    state = _state_dir(name)
    ready = state / "ready.json"
    if command == "serve":
        return _serve(name)
    if command == "up":
        if ready.exists():
            print(f"already up: {json.loads(ready.read_text())['netns']}")
            return 0
        state.mkdir(parents=True, exist_ok=True)
        for stale in ("failed.txt", "stopped.txt"):
            (state / stale).unlink(missing_ok=True)
        with (state / "supervisor.log").open("ab") as log:
            subprocess.Popen(
                [sys.executable, "-m", "services.cluster", "serve"],
                cwd=Path(__file__).resolve().parents[1], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
            )  # fmt: skip
        print(f"starting (images and binaries build first if needed; logs in {state})", flush=True)
        while not ready.exists():
            if (state / "failed.txt").exists():
                print((state / "failed.txt").read_text(), file=sys.stderr)
                return 1
            time.sleep(1)
        info = json.loads(ready.read_text())
        print(
            f"up in {info['startup_s']['total']:.1f} s: network namespace {info['netns']}, API {info['server']}"
        )
        print("  scripts/cluster.sh kubectl get nodes      # kubectl inside the namespace")
        print("  scripts/cluster.sh shell                  # a shell inside it, KUBECONFIG set")
        return 0
    if command == "down":
        if ready.exists():
            pid = json.loads(ready.read_text())["supervisor"]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            while _pid_alive(pid):
                time.sleep(0.5)
        cleaned = clean_stale()
        ready.unlink(missing_ok=True)
        # Its etcd and node state too: the next `up` starts empty, not with the old pods restarting
        # while the new cluster checks its containment.
        shutil.rmtree(state / "cluster", ignore_errors=True)
        stopped = state / "stopped.txt"
        print(stopped.read_text() if stopped.exists() else "down", *(f"cleaned up {c}" for c in cleaned))
        return 0
    if not ready.exists():
        print(f"not up (scripts/cluster.sh up); state in {state}", file=sys.stderr)
        return 1
    info = json.loads(ready.read_text())
    env = {**os.environ, "KUBECONFIG": info["kubeconfig"]}
    prefix = ["nsenter", f"--net=/run/netns/{info['netns']}", "--"]
    if command == "status":
        print(
            f"up: network namespace {info['netns']}, API {info['server']}, supervisor pid {info['supervisor']}"
        )
        return subprocess.call([*prefix, info["kubectl"], "get", "nodes,pods", "-A", "-o", "wide"], env=env)
    if command == "kubectl":
        return subprocess.call([*prefix, info["kubectl"], *args], env=env)
    if command == "images":  # what the cluster's containerd holds, built here (no registry)
        for role, ref in sorted(info["images"].items()):
            print(f"{role:22} {ref}")
        return 0
    if command == "install":  # Echo with those images: manifests/ + its dev MinIO, as the e2e tier does
        from services.install import overlay

        where = overlay(info["images"], state / "install")
        print(f"applying {where} (manifests/ and manifests/dev/ with the images built here)", flush=True)
        kubectl = [*prefix, info["kubectl"]]
        code = subprocess.call([*kubectl, "apply", "--server-side", "-k", str(where)], env=env)
        for deployment in ("echorl-operator", "minio") if code == 0 else ():
            rollout = [
                "-n",
                "echorl-system",
                "rollout",
                "status",
                f"deployment/{deployment}",
                "--timeout=300s",
            ]
            code = code or subprocess.call([*kubectl, *rollout], env=env)
        return code
    if command == "shell":
        bin_dir = str(Path(info["kubectl"]).parent)
        env["PATH"] = f"{bin_dir}:{env['PATH']}"
        return subprocess.call([*prefix, os.environ.get("SHELL", "bash"), *args], env=env)
    print(
        f"unknown command {command!r}: up, down, status, images, install, kubectl ARGS..., shell",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
