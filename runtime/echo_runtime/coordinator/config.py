"""What the coordinator needs to know about its job: one frozen :class:`CoordinatorConfig`.

Built from a resolved EchoJob (:meth:`CoordinatorConfig.from_job`) plus the coordinator's own settings
(vocabulary size, lease timeout, heartbeat interval, task timeout). It checks what the spec alone does
not: the replay buffer can hold a batch, the heartbeat comes more often than the lease timeout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from echo_runtime import staleness

if TYPE_CHECKING:
    from echo_runtime.spec import ResolvedJob


@dataclasses.dataclass(frozen=True)
class CoordinatorConfig:
    """Everything the state machine needs to know about the job."""

    job: str
    policy: staleness.StalenessPolicy
    group_size: int
    batch_size: int
    buffer_capacity: int
    """Async replay-buffer capacity in groups (≥ batch_size); Sequential rounds use batch_size."""
    vocab_size: int
    pools: tuple[str, ...]
    pool_capacity: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Most leases one worker of a pool may hold (the pool's ``capacity``); a worker asking for more
    gets this many. Pools not listed: no limit beyond the worker's own."""
    pool_max_workers: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Most workers registered with a pool's token at once, quarantined ones included (``maxWorkers``)."""
    pool_max_leases: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Most leases all workers of a pool hold together (``maxLeases``)."""
    pool_engine: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    """``(backend, dtype)`` every worker of a pool must register with: the pool's ``backend`` and its
    ``dtype``, else the model's. What the trainer's checks of a rollout depend on (the token check is
    judged for float32 transformers and mlx workers only), so a worker may not choose them for itself.
    Pools not listed: any."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    lease_timeout: float = 30.0
    """A worker silent for this long loses its registration and its leases."""
    heartbeat_interval: float = 5.0
    task_timeout: float = 600.0
    """A lease older than this is re-issued even if its worker still heartbeats (a hung generation)."""
    rate_window: float = 30.0
    """Seconds over which rollouts/s are averaged."""
    seed: int = 0
    dynamic_sampling: bool = False
    """Keep groups whose rewards are all equal out of batches (:mod:`.signal`)."""
    set_aside_after: int = 2
    """Dynamic sampling: skip once a prompt whose last this-many groups were all filtered."""
    pacing: bool = True
    """Lease only what can still be consumed within the bound (:func:`echo_runtime.staleness.lease_floor`).
    Off (``--no-pacing``) only to measure what pacing saves: tasks are then tagged ``t_train − bound``
    and fast workers generate groups that are dropped."""

    def __post_init__(self) -> None:
        if self.buffer_capacity < self.batch_size:
            raise ValueError(
                f"bufferSize: must be ≥ batchSize ({self.batch_size}) or no batch could ever fill, "
                f"got {self.buffer_capacity}"
            )
        if self.vocab_size < 1:
            raise ValueError(f"vocabSize: must be ≥ 1, got {self.vocab_size}")
        if not self.pools:
            raise ValueError("pools: the job needs at least one inference pool")
        if self.heartbeat_interval >= self.lease_timeout:
            raise ValueError(
                f"heartbeatInterval ({self.heartbeat_interval}s) must be shorter than leaseTimeout "
                f"({self.lease_timeout}s)"
            )

    @classmethod
    def from_job(
        cls,
        job: ResolvedJob,
        *,
        vocab_size: int,
        lease_timeout: float = 30.0,
        heartbeat_interval: float = 5.0,
        task_timeout: float = 600.0,
        pacing: bool = True,
    ) -> CoordinatorConfig:
        """The configuration of a resolved EchoJob plus the coordinator's own settings."""
        sync, algo = job.sync_policy, job.spec.algorithm
        if sync.mode == "Colocated":
            raise ValueError(
                "syncPolicy.mode: Colocated runs sampling and training in one process, without a coordinator; "
                "use Sequential or Async"
            )
        capacity = buffer_capacity(job)
        return cls(
            job=job.name,
            policy=staleness.StalenessPolicy.from_spec(sync),
            group_size=algo.group_size,
            batch_size=algo.batch_size,
            buffer_capacity=capacity,
            vocab_size=vocab_size,
            pools=tuple(name for name, _ in job.inference_pools),
            pool_capacity={name: pool.capacity for name, pool in job.inference_pools},
            pool_max_workers={
                name: pool.max_workers for name, pool in job.inference_pools if pool.max_workers is not None
            },
            pool_max_leases={
                name: pool.max_leases for name, pool in job.inference_pools if pool.max_leases is not None
            },
            pool_engine={
                name: (pool.backend, pool.dtype or job.spec.model.dtype) for name, pool in job.inference_pools
            },
            temperature=algo.sampling.temperature,
            top_p=algo.sampling.top_p,
            max_new_tokens=algo.sampling.max_new_tokens,
            seed=algo.seed,
            dynamic_sampling=algo.objective().dynamic_sampling,
            set_aside_after=algo.dynamic_sampling.set_aside_after,
            lease_timeout=lease_timeout,
            heartbeat_interval=heartbeat_interval,
            task_timeout=task_timeout,
            pacing=pacing,
        )


def buffer_capacity(job: ResolvedJob) -> int:
    """Groups the replay buffer holds: ``syncPolicy.bufferSize``, else twice the batch."""
    size = job.sync_policy.buffer_size
    return size if size is not None else 2 * job.spec.algorithm.batch_size
