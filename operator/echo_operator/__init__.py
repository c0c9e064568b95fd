"""Echo's Kubernetes operator: EchoJobs reconciled into coordinator, inference pools and trainer.

Layout (each module small and single-purpose; the pure ones carry the dense tests):

* :mod:`~echo_operator.crds` — the CRDs, generated from :mod:`echo_runtime.spec` (``python -m echo_operator.crds``);
* :mod:`~echo_operator.names` — names and labels of every child;
* :mod:`~echo_operator.children` — the desired children of a job (pure; one module per thing rendered);
* :mod:`~echo_operator.status`, :mod:`~echo_operator.conditions`, :mod:`~echo_operator.pool_lag` — status,
  conditions and Δmax enforcement from what was observed (pure);
* :mod:`~echo_operator.kube`, :mod:`~echo_operator.storage`, :mod:`~echo_operator.observe` — the I/O shells
  (Kubernetes API, S3/MinIO, the coordinator's status endpoint);
* :mod:`~echo_operator.reconcile` — the reconciler that ties them together;
* :mod:`~echo_operator.handlers` — the kopf registrations (``kopf run -m echo_operator.handlers``).

Importing this package registers nothing; importing :mod:`echo_operator.handlers` does.
"""
