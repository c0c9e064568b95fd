"""A real Kueue manager (built by ``scripts/testbin.sh`` from ``sigs.k8s.io/kueue``) for a test API server.

:func:`start_kueue` installs Kueue's CRDs (those of the same module version, ``kueue-crds/`` beside the
bin directory), writes its configuration and certificates, starts the manager as a process with the
given kubeconfig, registers Kueue's own webhooks with the API server, waits until they answer, and
then until its controllers reconcile (a probe ResourceFlavor, deleted, loses Kueue's finalizer).

It runs the way the manager runs without cert-manager and outside a pod: no leader election, no
internal certificate management, no visibility server, metrics off. **The webhooks are Kueue's
own**: the Mutating- and ValidatingWebhookConfiguration of the same module (``kueue-webhooks/``,
scoped by the namespace selectors of its kustomization, as every install of Kueue registers them),
with each webhook's ``clientConfig`` pointed at the manager's webhook server by URL
(``https://<host>:<port><path>``) instead of a Service, and ``caBundle`` the CA that signed the
server's certificate (SAN: the host IP). So every Workload, ClusterQueue, ResourceFlavor and Job the
tests write passes Kueue's admission exactly as on a cluster; disabled integrations answer with Kueue's
no-op handlers, again as on a cluster. The configurations are cluster-scoped and fail closed (a dead
webhook would refuse every Pod, Deployment and Job of the API server), so their names are unique per
manager and :meth:`Kueue.stop` removes them before it stops the process.

Everything stays on loopback: ``host`` must be a loopback address (the API server calls it there; in
the e2e cluster both run inside the cluster's network namespace, whose loopback it is).

``waitForPodsReady`` is off unless :class:`WaitForPodsReady` is given: then Kueue evicts an admitted
Workload whose ``PodsReady`` condition is not True within the timeout (reason ``PodsReadyTimeout``),
and requeues it after the backoff (``requeueState``; ``Requeued`` True with reason ``BackoffFinished``).

One host side effect: the manager reads its metrics certificate from the fixed path
``/etc/kueue/metrics/certs`` whenever internal certificate management is off (even with metrics off).
The first manager started by this process writes it there if it is missing, and the last one to stop
removes what was written.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.kube import ec_key, openssl, signed_cert
from services.procs import ManagedProcess, ServiceError

METRICS_CERTS = Path("/etc/kueue/metrics/certs")
START_TIMEOUT_S = 120.0
INSTANCE_LABEL = "echorl.dev/test-kueue"
"""On the webhook configurations a manager registered: its instance name (what :meth:`Kueue.stop` deletes)."""
RESOURCE_IN_USE = "kueue.x-k8s.io/resource-in-use"

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]

_host_lock = threading.Lock()
_host_users = 0
_host_created: Path | None = None


def crd_dir(bin_dir: Path) -> Path:
    """Kueue's CRDs, copied by ``scripts/testbin.sh`` from the module it built the manager from."""
    return bin_dir.parent / "kueue-crds"


def webhook_dir(bin_dir: Path) -> Path:
    """Kueue's webhook configurations (``manifests.yaml``) and the kustomization that scopes them,
    copied by ``scripts/testbin.sh`` from the same module."""
    return bin_dir.parent / "kueue-webhooks"


@dataclass(frozen=True)
class WaitForPodsReady:
    """Kueue's ``waitForPodsReady`` (on when given): an admitted Workload whose ``PodsReady`` is not
    True ``timeout_s`` after admission is evicted (``PodsReadyTimeout``) and requeued after a backoff
    of ``backoff_base_s`` doubling up to ``backoff_max_s`` (Kueue's defaults, 60 s and 3600 s, are far
    longer than a test waits); after ``backoff_limit`` requeues (None: never) Kueue deactivates it."""

    timeout_s: int
    backoff_base_s: int = 1
    backoff_max_s: int = 10
    backoff_limit: int | None = None
    block_admission: bool = False

    def config(self) -> dict[str, Any]:
        strategy: dict[str, Any] = {
            "timestamp": "Eviction",
            "backoffBaseSeconds": self.backoff_base_s,
            "backoffMaxSeconds": self.backoff_max_s,
        }
        if self.backoff_limit is not None:
            strategy["backoffLimitCount"] = self.backoff_limit
        return {
            "timeout": f"{self.timeout_s}s",
            "blockAdmission": self.block_admission,
            "requeuingStrategy": strategy,
        }


def _self_signed(directory: Path, name: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", directory / "tls.key", "-out", directory / "tls.crt",
        cwd=directory,
    )  # fmt: skip


def _hold_metrics_certs() -> None:
    global _host_users, _host_created
    with _host_lock:
        _host_users += 1
        if (METRICS_CERTS / "tls.crt").is_file() and (METRICS_CERTS / "tls.key").is_file():
            return
        top = Path("/etc/kueue")
        created = None if top.exists() else top
        _self_signed(METRICS_CERTS, "kueue-metrics")
        _host_created = _host_created or created or METRICS_CERTS


def _release_metrics_certs() -> None:
    global _host_users, _host_created
    with _host_lock:
        _host_users -= 1
        if _host_users == 0 and _host_created is not None:
            shutil.rmtree(_host_created, ignore_errors=True)
            _host_created = None


def _webhook_pki(workdir: Path, host: str) -> bytes:
    """A CA, and the webhook server's certificate signed by it for ``host`` (``tls.crt``/``tls.key``
    in ``webhook-certs/``, where the manager reads them); returns the CA certificate (PEM)."""
    pki, certs = workdir / "webhook-pki", workdir / "webhook-certs"
    pki.mkdir(parents=True, exist_ok=True)
    certs.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = pki / "ca.key", pki / "ca.crt"
    ec_key(ca_key, pki)
    openssl(
        "req", "-x509", "-new", "-key", ca_key, "-sha256", "-days", "2", "-subj", "/CN=echorl-test-kueue-ca",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-out", ca_cert, cwd=pki,
    )  # fmt: skip
    signed_cert(
        certs, "tls", "/CN=kueue-webhook",
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName=IP:{host}\n",
        ca_cert, ca_key,
    )  # fmt: skip
    return ca_cert.read_bytes()


def webhook_configurations(
    manifests: Path, instance: str, host: str, port: int, ca_pem: bytes
) -> list[dict[str, Any]]:
    """Kueue's Mutating- and ValidatingWebhookConfiguration from ``manifests`` (:func:`webhook_dir`),
    with its kustomization's patches (the namespace selectors) merged in, named ``<instance>-…`` and
    labelled with :data:`INSTANCE_LABEL`, every webhook calling ``https://host:port<path>``."""
    docs = [d for d in yaml.safe_load_all((manifests / "manifests.yaml").read_text()) if d]
    patches: dict[tuple[str, str], dict[str, Any]] = {}
    kustomization = yaml.safe_load((manifests / "kustomization.yaml").read_text()) or {}
    for entry in kustomization.get("patches") or []:
        patch = yaml.safe_load(entry["patch"])
        for hook in patch.get("webhooks") or []:
            patches[(patch["kind"], hook["name"])] = hook
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in docs:
        kind = doc["kind"]
        hooks = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook = {**hook, **patches.get((kind, hook["name"]), {})}
            hook["clientConfig"] = {"url": f"https://{host}:{port}{path}", "caBundle": bundle}
            hooks.append(hook)
        suffix = "mutating" if kind.startswith("Mutating") else "validating"
        out.append({
            "apiVersion": doc["apiVersion"],
            "kind": kind,
            "metadata": {"name": f"{instance}-{suffix}", "labels": {INSTANCE_LABEL: instance}},
            "webhooks": hooks,
        })  # fmt: skip
    return out


def config(
    workdir: Path,
    host: str,
    webhook_port: int,
    health_port: int,
    wait_for_pods_ready: WaitForPodsReady | None = None,
) -> str:
    """The manager's configuration (``config.kueue.x-k8s.io/v1beta2``); ``wait_for_pods_ready`` turns
    that on (in ``v1beta2`` the section's presence enables it)."""
    cfg: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": host, "port": webhook_port, "certDir": str(workdir / "webhook-certs")},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"{host}:{health_port}"},
        "featureGates": {"VisibilityOnDemand": False},
        # Echo needs no entry here: its operator writes the Workloads. `batch/job` is Kueue's default;
        # the trainer's Job carries no queue-name label, so Kueue leaves it alone.
        "integrations": {"frameworks": ["batch/job"]},
    }
    if wait_for_pods_ready is not None:
        cfg["waitForPodsReady"] = wait_for_pods_ready.config()
    return yaml.safe_dump(cfg, sort_keys=False)


def queues(name: str, namespace: str, cpu: str, memory: str) -> str:
    """What an admin sets up for a team: a ResourceFlavor and a ClusterQueue named ``name`` with that
    much CPU and memory for ``namespace`` alone, preempting lower priorities; a LocalQueue ``team`` in
    the namespace; WorkloadPriorityClasses ``<name>-low`` (100) and ``<name>-high`` (1000)."""
    kueue = "apiVersion: kueue.x-k8s.io/v1beta2"
    return f"""
{kueue}
kind: ResourceFlavor
metadata: {{name: {name}}}
---
{kueue}
kind: ClusterQueue
metadata: {{name: {name}}}
spec:
  namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {namespace}}}}}
  preemption: {{withinClusterQueue: LowerPriority}}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: {name}
      resources: [{{name: cpu, nominalQuota: "{cpu}"}}, {{name: memory, nominalQuota: {memory}}}]
---
{kueue}
kind: LocalQueue
metadata: {{name: team, namespace: {namespace}}}
spec: {{clusterQueue: {name}}}
---
{kueue}
kind: WorkloadPriorityClass
metadata: {{name: {name}-low}}
value: 100
---
{kueue}
kind: WorkloadPriorityClass
metadata: {{name: {name}-high}}
value: 1000
"""


@dataclass
class Kueue:
    """A running Kueue manager."""

    process: ManagedProcess
    kubectl: Kubectl
    instance: str = ""
    """The name of its webhook configurations (``<instance>-mutating``, ``<instance>-validating``)."""
    webhooks: list[str] = field(default_factory=list)
    """The webhook configurations it registered, as ``kind/name`` (removed by :meth:`stop`)."""

    def stop(self) -> None:
        """Remove its webhook configurations (first: nothing may call a manager that is going away),
        then stop the manager; the process stops even if the removal fails, which is then raised."""
        try:
            self._remove_webhooks()
        finally:
            try:
                self.process.stop()
            finally:
                _release_metrics_certs()

    def _remove_webhooks(self) -> None:
        if not self.webhooks:
            return
        last = ""
        for _ in range(5):
            proc = self.kubectl("delete", "--ignore-not-found", "--wait=true", *self.webhooks, timeout=60)
            if proc.returncode == 0:
                self.webhooks = []
                return
            last = proc.stderr
            time.sleep(1)
        raise ServiceError(f"removing Kueue's webhook configurations {self.webhooks} failed:\n{last}")


def start_kueue(
    bin_dir: Path,
    kubeconfig: Path,
    workdir: Path,
    kubectl: Kubectl,
    wrap: Callable[[Sequence[str | os.PathLike[str]]], Sequence[str | os.PathLike[str]]] = lambda argv: argv,
    host: str = "127.0.0.1",
    ports: tuple[int, int] = (19443, 18081),
    env: dict[str, str] | None = None,
    timeout: float = START_TIMEOUT_S,
    wait_for_pods_ready: WaitForPodsReady | None = None,
) -> Kueue:
    """Install Kueue's CRDs through ``kubectl``, start its manager and register its webhooks; ``wrap``
    runs it elsewhere (``nsenter --net`` into a cluster's namespace), ``host`` (loopback) is where it
    listens and the API server calls its webhooks, ``ports`` are its webhook and health ports."""
    crds, hooks = crd_dir(bin_dir), webhook_dir(bin_dir)
    if not (bin_dir / "kueue").is_file() or not crds.is_dir() or not (hooks / "manifests.yaml").is_file():
        raise ServiceError(f"{bin_dir}: no kueue binary, {crds} or {hooks}: run scripts/testbin.sh")
    if not ipaddress.ip_address(host).is_loopback:
        raise ServiceError(f"Kueue's webhook server listens on loopback only, not {host}")
    proc = kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds), timeout=180)
    if proc.returncode != 0:
        raise ServiceError(f"installing Kueue's CRDs failed:\n{proc.stderr}")
    names = [f"crd/{p.stem.split('_', 1)[1]}.{p.stem.split('_', 1)[0]}" for p in sorted(crds.glob("*.yaml"))]
    proc = kubectl("wait", "--for=condition=Established", "--timeout=60s", *names, timeout=90)
    if proc.returncode != 0:
        raise ServiceError(f"Kueue's CRDs were not Established:\n{proc.stderr}")
    workdir.mkdir(parents=True, exist_ok=True)
    ca_pem = _webhook_pki(workdir, host)
    cfg = workdir / "kueue-config.yaml"
    cfg.write_text(config(workdir, host, *ports, wait_for_pods_ready=wait_for_pods_ready))
    _hold_metrics_certs()
    try:
        argv = wrap([bin_dir / "kueue", f"--config={cfg}", f"--kubeconfig={kubeconfig}", "--zap-log-level=2"])
        full_env = {**(env if env is not None else os.environ), "KUBECONFIG": str(kubeconfig)}
        process = ManagedProcess("kueue", argv, log_path=workdir / "kueue.log", env=full_env).start()
    except BaseException:
        _release_metrics_certs()
        raise
    instance = f"echorl-test-kueue-{secrets.token_hex(4)}"
    kueue = Kueue(process, kubectl, instance)
    try:
        _register_webhooks(kueue, webhook_configurations(hooks, instance, host, ports[0], ca_pem))
        _wait_webhooks(kueue, timeout)
        _wait_reconciling(kueue, timeout)
    except BaseException:
        kueue.stop()
        raise
    return kueue


def _register_webhooks(kueue: Kueue, configurations: list[dict[str, Any]]) -> None:
    kueue.webhooks = [f"{c['kind'].lower()}/{c['metadata']['name']}" for c in configurations]
    text = yaml.safe_dump_all(configurations, sort_keys=False)
    proc = kueue.kubectl("apply", "--server-side", "-f", "-", input=text, timeout=60)
    if proc.returncode != 0:
        raise ServiceError(f"registering Kueue's webhooks failed:\n{proc.stderr}")


def _wait_webhooks(kueue: Kueue, timeout: float) -> None:
    """Kueue's webhooks answer the API server: a server-side dry-run of a ResourceFlavor comes back
    with the finalizer only Kueue's defaulting webhook adds, and one of a Workload asking for the
    ``pods`` resource is denied by its validating webhook (the CRD's schema allows it)."""
    flavor = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": f"{kueue.instance}-probe"},
    }
    container = {"name": "c", "image": "none", "resources": {"requests": {"pods": "1"}}}
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": f"{kueue.instance}-probe", "namespace": "default"},
        "spec": {
            "podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": [container]}}}]
        },
    }
    last: list[str] = []

    def answering() -> bool:
        dry = ("create", "--dry-run=server", "-f", "-")
        proc = kueue.kubectl(*dry, "-o", "jsonpath={.metadata.finalizers}", input=yaml.safe_dump(flavor))
        last[:] = [f"ResourceFlavor: {proc.stdout}{proc.stderr}"]
        if proc.returncode != 0 or RESOURCE_IN_USE not in proc.stdout:
            return False
        proc = kueue.kubectl(*dry, input=yaml.safe_dump(workload))
        last.append(f"Workload: {proc.stdout}{proc.stderr}")
        return proc.returncode != 0 and "vworkload.kb.io" in proc.stderr and "reserved" in proc.stderr

    try:
        kueue.process.wait_healthy(answering, timeout=timeout, interval=0.5)
    except ServiceError as exc:
        raise ServiceError(f"{exc}\nKueue's webhooks did not answer; last: {last}") from None


def _wait_reconciling(kueue: Kueue, timeout: float) -> None:
    """Kueue's controllers run: a new ResourceFlavor (given Kueue's ``resource-in-use`` finalizer by
    its webhook), once deleted, is gone — only the controller removes the finalizer of a flavor no
    ClusterQueue uses."""
    name = f"{kueue.instance}-probe"
    probe = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": name}}
    proc = kueue.kubectl(
        "create", "-f", "-", "-o", "jsonpath={.metadata.finalizers}", input=yaml.safe_dump(probe)
    )
    if proc.returncode != 0 or RESOURCE_IN_USE not in proc.stdout:
        raise ServiceError(
            f"the probe ResourceFlavor came back without Kueue's finalizer:\n{proc.stdout}{proc.stderr}"
        )
    kueue.kubectl("delete", "resourceflavor", name, "--wait=false")

    def gone() -> bool:
        proc = kueue.kubectl("get", "resourceflavor", name, "--ignore-not-found", "-o", "name")
        return proc.returncode == 0 and not proc.stdout.strip()

    kueue.process.wait_healthy(gone, timeout=timeout, interval=0.5)
