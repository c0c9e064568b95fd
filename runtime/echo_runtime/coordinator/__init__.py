"""The coordinator: one per job; leases, the replay buffer, both sync protocols and the Δmax bound.

The staleness rule it enforces lives in :mod:`echo_runtime.staleness`, shared with the trainer, the
simulator and the operator.

Layout (pure decisions, thin I/O shells):

* :mod:`.buffer` — the task ledger: pending queue, lease table, bounded replay buffer;
* :mod:`.state` — the state machine of both protocols (no I/O, clock passed in);
* :mod:`.wire` — request and reply models (shared by the service and the client);
* :mod:`.auth` — hashed join tokens and worker sessions;
* :mod:`.metrics` — Prometheus export;
* :mod:`.api` / :mod:`.service` — the FastAPI shell and the uvicorn runner;
* :mod:`.client` — the only way other parts of Echo talk to a coordinator.

See docs/coordinator.md.
"""
