"""A real Kubernetes API (etcd + kube-apiserver) on loopback, arranged the way envtest does it.

:func:`start_kube_apiserver` makes a throwaway PKI with the ``openssl`` CLI (a CA, a serving
certificate for ``127.0.0.1``/``localhost``, an admin client certificate in group
``system:masters``, an unprivileged client certificate with no groups, and a service-account
signing key), starts ``etcd`` on free loopback ports with a temporary data dir, starts
``kube-apiserver`` against it with RBAC and client-certificate authentication, waits for
``/readyz``, and writes two kubeconfigs.

There is no kubelet, scheduler or kube-controller-manager: pods are stored but never run,
namespaces stay ``Terminating`` after deletion, service accounts get no token secrets, and
owner-reference garbage collection does not happen. Schemas, defaulting, CEL validation, status
and scale subresources, watches, admission, and RBAC are all real.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from services.procs import ManagedProcess, ServiceError, free_ports

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

ADMIN_USER = "echorl-test-admin"
UNPRIVILEGED_USER = "echorl-test-user"
START_TIMEOUT_S = 90.0


# ---------------------------------------------------------------------------------------------
# PKI (openssl CLI: the `cryptography` package is not among the project's dependencies)


@dataclass(frozen=True)
class Pki:
    """Paths of the throwaway certificates and keys."""

    dir: Path
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    user_cert: Path
    user_key: Path
    sa_key: Path
    sa_pub: Path


def openssl(*args: str | os.PathLike[str], cwd: Path) -> None:
    proc = subprocess.run(
        ["openssl", *[os.fspath(a) for a in args]], cwd=cwd, capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise ServiceError(
            f"openssl {' '.join(os.fspath(a) for a in args)} failed ({proc.returncode}):\n"
            + proc.stderr.decode(errors="replace")
        )


def ec_key(path: Path, cwd: Path) -> None:
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path, cwd=cwd)


def signed_cert(pki_dir: Path, name: str, subject: str, extensions: str, ca_cert: Path, ca_key: Path) -> None:
    key, csr, crt, ext = (pki_dir / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    ec_key(key, pki_dir)
    openssl("req", "-new", "-key", key, "-subj", subject, "-out", csr, cwd=pki_dir)
    ext.write_text(extensions)
    openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        ca_cert,
        "-CAkey",
        ca_key,
        "-CAcreateserial",
        "-days",
        "7",
        "-sha256",
        "-extfile",
        ext,
        "-out",
        crt,
        cwd=pki_dir,
    )


def make_pki(pki_dir: Path) -> Pki:
    """Create the CA, serving, client and service-account keys under ``pki_dir``."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = pki_dir / "ca.key", pki_dir / "ca.crt"
    ec_key(ca_key, pki_dir)
    openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        ca_key,
        "-sha256",
        "-days",
        "7",
        "-subj",
        "/CN=echorl-test-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out",
        ca_cert,
        cwd=pki_dir,
    )
    leaf = "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    signed_cert(
        pki_dir,
        "serving",
        "/CN=kube-apiserver",
        leaf + "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,IP:10.0.0.1\n",
        ca_cert,
        ca_key,
    )
    signed_cert(
        pki_dir,
        "admin",
        f"/O=system:masters/CN={ADMIN_USER}",
        leaf + "extendedKeyUsage=clientAuth\n",
        ca_cert,
        ca_key,
    )
    signed_cert(
        pki_dir, "user", f"/CN={UNPRIVILEGED_USER}", leaf + "extendedKeyUsage=clientAuth\n", ca_cert, ca_key
    )
    sa_key, sa_pub = pki_dir / "sa.key", pki_dir / "sa.pub"
    ec_key(sa_key, pki_dir)
    openssl("pkey", "-in", sa_key, "-pubout", "-out", sa_pub, cwd=pki_dir)
    for p in pki_dir.glob("*.key"):
        p.chmod(0o600)
    return Pki(
        dir=pki_dir,
        ca_cert=ca_cert,
        ca_key=ca_key,
        serving_cert=pki_dir / "serving.crt",
        serving_key=pki_dir / "serving.key",
        admin_cert=pki_dir / "admin.crt",
        admin_key=pki_dir / "admin.key",
        user_cert=pki_dir / "user.crt",
        user_key=pki_dir / "user.key",
        sa_key=sa_key,
        sa_pub=sa_pub,
    )


def write_kubeconfig(path: Path, server: str, ca_cert: Path, cert: Path, key: Path, user: str) -> Path:
    """Write a self-contained kubeconfig (certificates embedded) for one client identity."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "echorl-test", "cluster": {"server": server, "certificate-authority-data": b64(ca_cert)}}
        ],
        "users": [
            {"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}
        ],
        "contexts": [
            {"name": user, "context": {"cluster": "echorl-test", "user": user, "namespace": "default"}}
        ],
        "current-context": user,
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------------------------------------
# The running API server


@dataclass
class KubeApiServer:
    """etcd + kube-apiserver, with an admin and an unprivileged kubeconfig."""

    url: str
    kubeconfig: Path
    unprivileged_kubeconfig: Path
    bin_dir: Path
    workdir: Path
    pki: Pki
    etcd_url: str
    etcd: ManagedProcess
    apiserver: ManagedProcess
    startup_s: dict[str, float] = field(default_factory=dict)

    admin_user: str = ADMIN_USER
    unprivileged_user: str = UNPRIVILEGED_USER

    # -- the audit log -------------------------------------------------------------------------
    def audit(self) -> list[dict[str, Any]]:
        """Every write the API server answered so far (its audit events, oldest first)."""
        path = self.workdir / "audit.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    # -- clients -----------------------------------------------------------------------------
    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | bytes | None = None,
        check: bool = False,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built ``kubectl`` (admin kubeconfig unless given) and return the completed process.

        Output is text. With ``check=True`` a non-zero exit raises ``CalledProcessError``.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        env["HOME"] = str(self.workdir)  # no ~/.kube pollution, no stray user config
        argv = [
            str(self.bin_dir / "kubectl"),
            f"--kubeconfig={kubeconfig or self.kubeconfig}",
            f"--cache-dir={self.workdir / 'kubectl-cache'}",
            *args,
        ]
        text_input = input.decode() if isinstance(input, bytes) else input
        return subprocess.run(
            argv, input=text_input, capture_output=True, text=True, env=env, timeout=timeout, check=check
        )

    def kubectl_json(self, *args: str, kubeconfig: Path | None = None) -> Any:
        """``kubectl <args> -o json``, parsed; raises with kubectl's stderr on failure."""
        proc = self.kubectl(*args, "-o", "json", kubeconfig=kubeconfig)
        if proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return json.loads(proc.stdout)

    def api_client(self, unprivileged: bool = False) -> ApiClient:
        """A new ``kubernetes.client.ApiClient`` (admin, or the unprivileged identity)."""
        from kubernetes import config

        path = self.unprivileged_kubeconfig if unprivileged else self.kubeconfig
        return config.new_client_from_config(config_file=str(path))

    # -- CRDs --------------------------------------------------------------------------------
    def install_crds(self, *paths: Path, timeout: float = 60.0) -> list[str]:
        """Apply the YAML files/dirs given and wait until every CRD in them is Established.

        Every document with an ``apiVersion`` and ``kind`` is applied (server-side), except kustomize
        files (``kind: Kustomization``). Returns the names of the CustomResourceDefinitions found.
        """
        files = sorted(_yaml_files(paths))
        docs: list[dict[str, Any]] = []
        for f in files:
            for doc in yaml.safe_load_all(f.read_text()):
                if isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind") != "Kustomization":
                    docs.append(doc)
        if not docs:
            return []
        names = [d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"]
        proc = self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            input=yaml.safe_dump_all(docs),
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise ServiceError(f"kubectl apply of {[str(f) for f in files]} failed:\n{proc.stderr}")
        self.wait_crds_established(names, timeout=timeout)
        return names

    def wait_crds_established(self, names: Sequence[str], timeout: float = 60.0) -> None:
        """Wait until each named CRD has condition Established=True and its API is served."""
        if not names:
            return
        proc = self.kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={int(timeout)}s",
            *[f"customresourcedefinition/{n}" for n in names],
            timeout=timeout + 10,
        )
        if proc.returncode != 0:
            raise ServiceError(f"CRDs {names} not Established within {timeout:.0f} s:\n{proc.stderr}")
        # Established means the API is being served; make sure discovery lists it too.
        deadline = time.monotonic() + timeout
        for name in names:
            crd = self.kubectl_json("get", f"customresourcedefinition/{name}")
            group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
            served = [v["name"] for v in crd["spec"]["versions"] if v.get("served")]
            for version in served:
                while not self._discovered(group, version, plural):
                    if time.monotonic() > deadline:
                        raise ServiceError(f"{plural}.{group}/{version} never appeared in discovery")
                    time.sleep(0.1)

    def _discovered(self, group: str, version: str, plural: str) -> bool:
        try:
            body = self.get(f"/apis/{group}/{version}")
        except urllib.error.HTTPError:
            return False
        return any(r.get("name") == plural for r in json.loads(body).get("resources", []))

    # -- raw HTTPS ---------------------------------------------------------------------------
    def ssl_context(self, unprivileged: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        if unprivileged:
            ctx.load_cert_chain(str(self.pki.user_cert), str(self.pki.user_key))
        else:
            ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def get(self, path: str, unprivileged: bool = False, timeout: float = 5.0) -> bytes:
        """GET ``path`` on the API server with a client certificate; raises ``HTTPError`` on non-2xx."""
        with urllib.request.urlopen(
            self.url + path, context=self.ssl_context(unprivileged), timeout=timeout
        ) as resp:
            return bytes(resp.read())

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd."""
        try:
            self.apiserver.stop()
        finally:
            self.etcd.stop()


def _yaml_files(paths: Iterable[Path]) -> Iterable[Path]:
    for p in paths:
        if p.is_dir():
            yield from (f for f in p.rglob("*") if f.suffix in (".yaml", ".yml") and f.is_file())
        elif p.is_file():
            yield p


def _http_ok(url: str, context: ssl.SSLContext | None = None, expect: bytes | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as resp:
            body = resp.read()
            return bool(resp.status == 200 and (expect is None or expect in body))
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def start_etcd(bin_dir: Path, workdir: Path, timeout: float = START_TIMEOUT_S) -> tuple[ManagedProcess, str]:
    """Start a single-member etcd on free loopback ports; return it and its client URL."""
    client_port, peer_port = free_ports(2)
    client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    data_dir = workdir / "etcd-data"
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    proc = ManagedProcess(
        "etcd",
        [
            bin_dir / "etcd",
            "--name=default",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",  # test data: durability traded for speed, as envtest does
            "--log-level=warn",
        ],
        log_path=workdir / "etcd.log",
        env={k: v for k, v in os.environ.items() if not k.startswith("ETCD")},
    ).start()
    try:
        proc.wait_healthy(lambda: _http_ok(f"{client_url}/health", expect=b'"health":"true"'), timeout)
    except BaseException:
        proc.stop()
        raise
    return proc, client_url


AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete]
  - level: None
"""
"""Every write, at the Metadata level (who, with which User-Agent, what, when, the answer's code):
what tests read to show which operator replica wrote what (:meth:`KubeApiServer.audit`)."""


def apiserver_args(bin_dir: Path, pki: Pki, etcd_url: str, port: int, workdir: Path) -> list[str]:
    """The kube-apiserver command line (envtest's flags, RBAC on, client-certificate auth, every write
    audited to ``workdir/audit.log``)."""
    policy = workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'apiserver-certs'}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        "--authorization-mode=RBAC",
        "--anonymous-auth=false",
        f"--service-account-issuer=https://127.0.0.1:{port}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--allow-privileged=true",
        # No controller-manager creates default service accounts, so pods could never be admitted.
        "--disable-admission-plugins=ServiceAccount",
        "--endpoint-reconciler-type=none",
        "--enable-priority-and-fairness=false",
        "--profiling=false",
        f"--audit-policy-file={policy}",
        f"--audit-log-path={workdir / 'audit.log'}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",  # an event is in the file before the write is answered
        "--v=1",
    ]


def start_kube_apiserver(bin_dir: Path, workdir: Path, timeout: float = START_TIMEOUT_S) -> KubeApiServer:
    """Start etcd and kube-apiserver under ``workdir`` and wait until ``/readyz`` answers ok."""
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    pki = make_pki(workdir / "pki")
    t_pki = time.monotonic() - t0
    etcd, etcd_url = start_etcd(bin_dir, workdir, timeout)
    t_etcd = time.monotonic() - t0 - t_pki
    try:
        (port,) = free_ports(1)
        url = f"https://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
        apiserver = ManagedProcess(
            "kube-apiserver",
            apiserver_args(bin_dir, pki, etcd_url, port, workdir),
            log_path=workdir / "kube-apiserver.log",
            env=env,
        ).start()
        admin_ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        admin_ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        try:
            t_api = apiserver.wait_healthy(lambda: _http_ok(f"{url}/readyz", admin_ctx, b"ok"), timeout)
        except BaseException:
            apiserver.stop()
            raise
    except BaseException:
        etcd.stop()
        raise
    server = KubeApiServer(
        url=url,
        kubeconfig=write_kubeconfig(
            workdir / "admin.kubeconfig", url, pki.ca_cert, pki.admin_cert, pki.admin_key, ADMIN_USER
        ),
        unprivileged_kubeconfig=write_kubeconfig(
            workdir / "unprivileged.kubeconfig",
            url,
            pki.ca_cert,
            pki.user_cert,
            pki.user_key,
            UNPRIVILEGED_USER,
        ),
        bin_dir=bin_dir,
        workdir=workdir,
        pki=pki,
        etcd_url=etcd_url,
        etcd=etcd,
        apiserver=apiserver,
        startup_s={"pki": t_pki, "etcd": t_etcd, "kube-apiserver": t_api, "total": time.monotonic() - t0},
    )
    try:
        _wait_default_namespace(server, timeout)
    except BaseException:
        server.stop()
        raise
    server.startup_s["total"] = time.monotonic() - t0
    return server


def _wait_default_namespace(server: KubeApiServer, timeout: float) -> None:
    """``/readyz`` can pass a moment before the bootstrap controller creates ``default``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            server.get("/api/v1/namespaces/default")
            return
        except urllib.error.HTTPError as exc:
            if exc.code != 404 or time.monotonic() > deadline:
                raise ServiceError(
                    server.apiserver.describe_failure(f"namespace 'default' not readable: {exc}")
                ) from exc
        time.sleep(0.1)
