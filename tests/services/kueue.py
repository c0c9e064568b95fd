"""A real Kueue manager (built by ``scripts/testbin.sh`` from ``sigs.k8s.io/kueue``) for a test API server.

:func:`start_kueue` installs Kueue's CRDs (those of the same module version, ``kueue-crds/`` beside the
bin directory), writes its configuration and certificates, starts the manager as a process with the
given kubeconfig, and waits until it reconciles (a probe ResourceFlavor gets Kueue's finalizer).

It runs the way the manager runs without cert-manager and outside a pod: no leader election, no
internal certificate management, no visibility server, metrics off, and no webhook configurations
registered with the API server (the webhook server starts, with a self-signed certificate, but the
API server never calls it). So Kueue defaults nothing that a webhook would: the Workloads the
operator writes are complete by themselves, which is what Echo's integration promises anyway.

One host side effect: the manager reads its metrics certificate from the fixed path
``/etc/kueue/metrics/certs`` whenever internal certificate management is off (even with metrics off).
The first manager started by this process writes it there if it is missing, and the last one to stop
removes what was written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from services.kube import openssl
from services.procs import ManagedProcess, ServiceError

METRICS_CERTS = Path("/etc/kueue/metrics/certs")
PROBE_FLAVOR = "echorl-test-kueue-probe"
START_TIMEOUT_S = 120.0

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]

_host_lock = threading.Lock()
_host_users = 0
_host_created: Path | None = None


def crd_dir(bin_dir: Path) -> Path:
    """Kueue's CRDs, copied by ``scripts/testbin.sh`` from the module it built the manager from."""
    return bin_dir.parent / "kueue-crds"


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


def config(workdir: Path, host: str, webhook_port: int, health_port: int) -> str:
    """The manager's configuration (``config.kueue.x-k8s.io/v1beta2``)."""
    cfg = {
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

    def stop(self) -> None:
        try:
            self.process.stop()
        finally:
            _release_metrics_certs()


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
) -> Kueue:
    """Install Kueue's CRDs through ``kubectl`` and start its manager; ``wrap`` runs it elsewhere
    (``nsenter --net`` into a cluster's namespace), ``ports`` are its webhook and health ports."""
    crds = crd_dir(bin_dir)
    if not (bin_dir / "kueue").is_file() or not crds.is_dir():
        raise ServiceError(f"{bin_dir}: no kueue binary or {crds}: run scripts/testbin.sh")
    proc = kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds), timeout=180)
    if proc.returncode != 0:
        raise ServiceError(f"installing Kueue's CRDs failed:\n{proc.stderr}")
    names = [f"crd/{p.stem.split('_', 1)[1]}.{p.stem.split('_', 1)[0]}" for p in sorted(crds.glob("*.yaml"))]
    proc = kubectl("wait", "--for=condition=Established", "--timeout=60s", *names, timeout=90)
    if proc.returncode != 0:
        raise ServiceError(f"Kueue's CRDs were not Established:\n{proc.stderr}")
    workdir.mkdir(parents=True, exist_ok=True)
    _self_signed(workdir / "webhook-certs", "kueue-webhook")
    cfg = workdir / "kueue-config.yaml"
    cfg.write_text(config(workdir, host, *ports))
    _hold_metrics_certs()
    try:
        argv = wrap([bin_dir / "kueue", f"--config={cfg}", f"--kubeconfig={kubeconfig}", "--zap-log-level=2"])
        full_env = {**(env if env is not None else os.environ), "KUBECONFIG": str(kubeconfig)}
        process = ManagedProcess("kueue", argv, log_path=workdir / "kueue.log", env=full_env).start()
    except BaseException:
        _release_metrics_certs()
        raise
    kueue = Kueue(process, kubectl)
    try:
        _wait_reconciling(kueue, timeout)
    except BaseException:
        kueue.stop()
        raise
    return kueue


def _wait_reconciling(kueue: Kueue, timeout: float) -> None:
    """Kueue's controllers run once a new ResourceFlavor gets its ``resource-in-use`` finalizer."""
    probe = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": PROBE_FLAVOR},
    }
    kueue.kubectl("apply", "-f", "-", input=yaml.safe_dump(probe), check=False)

    def finalized() -> bool:
        proc = kueue.kubectl("get", "resourceflavor", PROBE_FLAVOR, "-o", "jsonpath={.metadata.finalizers}")
        return "kueue.x-k8s.io/resource-in-use" in proc.stdout

    kueue.process.wait_healthy(finalized, timeout=timeout, interval=0.5)
    kueue.kubectl("delete", "resourceflavor", PROBE_FLAVOR, "--wait=false")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # Kueue removes its finalizer from an unused flavor
        if kueue.kubectl("get", "resourceflavor", PROBE_FLAVOR).returncode != 0:
            return
        time.sleep(0.5)
