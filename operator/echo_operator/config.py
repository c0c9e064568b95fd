"""Operator settings: images, intervals and addresses, read once from ``ECHORL_*`` environment variables.

Everything has a default that works in a cluster; the operator Deployment in ``manifests/`` sets the
images to the release's tags. Tests override the coordinator URL (the coordinator runs as a local
process there) and shorten the intervals.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Literal

from echo_operator import names

DEFAULT_REGISTRY = "ghcr.io/echorl"
VERSION = "0.1.0"

ExternalServiceType = Literal["LoadBalancer", "NodePort", "None"]


@dataclasses.dataclass(frozen=True)
class Images:
    """Container images of the processes the operator starts."""

    coordinator: str = f"{DEFAULT_REGISTRY}/echorl-worker-cpu:{VERSION}"
    """The coordinator is pure Python; the CPU worker image has everything it needs."""
    worker_cpu: str = f"{DEFAULT_REGISTRY}/echorl-worker-cpu:{VERSION}"
    """transformers (CPU/CUDA via torch) and mlx (Linux CPU) workers."""
    worker_vllm: str = f"{DEFAULT_REGISTRY}/echorl-worker-vllm:{VERSION}"
    trainer: str = f"{DEFAULT_REGISTRY}/echorl-trainer:{VERSION}"

    def worker(self, backend: str, device: str) -> str:
        """The default image of an inference pool: vLLM's for vllm, else the CPU image.

        The CPU image's torch is the CUDA build from PyPI, so it also serves ``device: cuda`` pools.
        """
        return self.worker_vllm if backend == "vllm" else self.worker_cpu


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the operator needs besides the objects it watches."""

    images: Images = dataclasses.field(default_factory=Images)
    image_pull_policy: str = "IfNotPresent"
    coordinator_url: str = "http://{coordinator}.{namespace}.svc:{port}"
    """Template of the URL the operator reads ``/v1/status`` from: ``{job}``, ``{namespace}``,
    ``{coordinator}`` (the Service name) and ``{port}`` are filled in."""
    status_interval_s: float = 10.0
    """How often each job's status is refreshed from its coordinator."""
    status_write_interval_s: float = 30.0
    """When only a running job's figures moved (reward, rollouts/s, policy version, staleness counts,
    heartbeats), its status is written at most this often; a change of anything else (a condition,
    pods, workers, restarts) is written at once."""
    resync_interval_s: float = 60.0
    """How often children are re-applied to undo drift (a no-op when nothing drifted)."""
    http_timeout_s: float = 3.0
    behind_grace_s: float = 30.0
    """A pool must stay too far behind t_train this long before StalenessBounded turns False."""
    restart_cooldown_s: float = 120.0
    """A stuck worker pod is deleted at most once per this many seconds."""
    external_service_type: ExternalServiceType = "LoadBalancer"
    """How a job with external pools exposes its coordinator (``None``: the user provides an
    Ingress and sets the ``echorl.dev/external-url`` annotation)."""
    metrics_auth: bool = False
    """Coordinators serve ``/metrics`` only to the job's status token (``<job>-status-token``, key
    ``token``) or the trainer's; their pods then carry no ``prometheus.io/scrape`` annotations."""

    def status_url(self, job: str, namespace: str) -> str:
        return self.coordinator_url.format(
            job=job, namespace=namespace, coordinator=names.coordinator(job), port=names.COORDINATOR_PORT
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``ECHORL_*`` variables (see docs/operator.md for the list)."""
        env = os.environ if env is None else env
        base = Images()
        images = Images(
            coordinator=env.get("ECHORL_IMAGE_COORDINATOR", base.coordinator),
            worker_cpu=env.get("ECHORL_IMAGE_WORKER_CPU", base.worker_cpu),
            worker_vllm=env.get("ECHORL_IMAGE_WORKER_VLLM", base.worker_vllm),
            trainer=env.get("ECHORL_IMAGE_TRAINER", base.trainer),
        )
        defaults = cls()
        service_type = env.get("ECHORL_EXTERNAL_SERVICE_TYPE", defaults.external_service_type)
        if service_type not in ("LoadBalancer", "NodePort", "None"):
            raise ValueError(
                f"ECHORL_EXTERNAL_SERVICE_TYPE: must be LoadBalancer, NodePort or None, got {service_type!r}"
            )
        return cls(
            images=images,
            image_pull_policy=env.get("ECHORL_IMAGE_PULL_POLICY", defaults.image_pull_policy),
            coordinator_url=env.get("ECHORL_COORDINATOR_URL", defaults.coordinator_url),
            status_interval_s=_seconds(env, "ECHORL_STATUS_INTERVAL", defaults.status_interval_s),
            resync_interval_s=_seconds(env, "ECHORL_RESYNC_INTERVAL", defaults.resync_interval_s),
            status_write_interval_s=_seconds(
                env, "ECHORL_STATUS_WRITE_INTERVAL", defaults.status_write_interval_s
            ),
            http_timeout_s=_seconds(env, "ECHORL_HTTP_TIMEOUT", defaults.http_timeout_s),
            behind_grace_s=_seconds(env, "ECHORL_BEHIND_GRACE", defaults.behind_grace_s),
            restart_cooldown_s=_seconds(env, "ECHORL_RESTART_COOLDOWN", defaults.restart_cooldown_s),
            external_service_type=service_type,  # type: ignore[arg-type]
            metrics_auth=_flag(env, "ECHORL_METRICS_AUTH", defaults.metrics_auth),
        )


def _flag(env: Mapping[str, str], key: str, default: bool) -> bool:
    raw = env.get(key)
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise ValueError(f"{key}: must be true or false, got {raw!r}")
    return raw.lower() == "true"


def _seconds(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{key}: must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{key}: must be > 0, got {raw!r}")
    return value
