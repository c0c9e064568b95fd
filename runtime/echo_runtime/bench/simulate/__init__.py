"""``echorl simulate``: a discrete-event simulator of Echo's sync protocols, for sizing swarms.

It predicts rollouts/s, trainer busy fraction, the staleness distribution and dropped work as
functions of Δmax and pool sizes, for swarms far larger than one machine (thousands of workers of
heterogeneous classes, with failures and rejoins, snapshot download bandwidth and trainer step time).

* :mod:`.config` — the configuration (dataclasses; YAML or JSON with camelCase keys);
* :mod:`.engine` — the event loop; it runs the coordinator's own task ledger and staleness rule;
* :mod:`.results` — what a run reports, and the runner's rollouts/s estimator;
* :mod:`.sweep` — grids over Δmax, pool sizes and buffer sizes, averaged over seeds;
* :mod:`.fit` — a configuration fitted to a measured local run (``benchmarks/simulate_validation.py``).

See docs/simulate.md.
"""

from echo_runtime.bench.simulate.config import (
    ConfigError,
    SimConfig,
    TrainerConfig,
    WorkerClass,
    config_from_mapping,
    load_config,
)
from echo_runtime.bench.simulate.engine import Simulator, simulate
from echo_runtime.bench.simulate.results import SimResult, windowed_rate

__all__ = [
    "ConfigError",
    "SimConfig",
    "SimResult",
    "Simulator",
    "TrainerConfig",
    "WorkerClass",
    "config_from_mapping",
    "load_config",
    "simulate",
    "windowed_rate",
]
