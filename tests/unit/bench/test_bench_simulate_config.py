"""The simulator's configuration: the example file loads, values are validated with actionable messages,
mappings round-trip, and the sweep variations (Δmax, pool sizes) do what they say."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from echo_runtime.bench.simulate import ConfigError, SimConfig, config_from_mapping, load_config

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "simulate" / "heterogeneous.yaml"

CPU: dict[str, object] = {"name": "cpu", "count": 2, "groupSeconds": 30}
MINIMAL: dict[str, object] = {"trainer": {"stepSeconds": 10}, "workerClasses": [CPU]}


def test_the_example_configuration_loads_with_four_hardware_classes() -> None:
    config = load_config(EXAMPLE)
    assert [c.name for c in config.worker_classes] == ["h100", "rtx5090", "m4pro", "cpu"]
    assert config.policy.max_staleness == 2 and config.policy.mode == "Async"
    assert config.buffer_capacity >= sum(c.count * c.capacity for c in config.worker_classes)


def test_defaults_follow_the_coordinator() -> None:
    config = config_from_mapping(MINIMAL)
    assert config.buffer_capacity == 2 * config.batch_size
    assert config.retry_seconds == min(1.0, config.heartbeat_interval)
    assert math.isinf(config.worker_classes[0].download_mbps)


def test_mapping_round_trips_through_json(tmp_path: Path) -> None:
    config = load_config(EXAMPLE)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config.to_mapping()))
    assert load_config(path) == config
    inf = config_from_mapping({**MINIMAL, "workerClasses": [{**CPU, "downloadMBps": ".inf"}]})
    assert config_from_mapping(json.loads(json.dumps(inf.to_mapping()))) == inf


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"maxStaleness": -1}, "maxStaleness: must be ≥ 0, got -1"),
        ({"mode": "Lockstep"}, "mode: must be one of Sequential, Async, got 'Lockstep'"),
        (
            {"bufferSize": 4, "batchSize": 8},
            "bufferSize: must be ≥ 8 (batchSize, or no batch could ever fill), got 4",
        ),
        ({"refreshThreshold": 3, "maxStaleness": 1}, "refreshThreshold: must be ≤ maxStaleness (1), got 3"),
        ({"maxStalness": 1}, "maxStalness: unknown key; allowed:"),
        (
            {"workerClasses": [{"name": "cpu", "count": 2, "groupSeconds": 0}]},
            "workerClasses['cpu'].groupSeconds: must be > 0, got 0",
        ),
        (
            {"workerClasses": [{"name": "cpu", "count": 2.5, "groupSeconds": 1}]},
            "workerClasses['cpu'].count: expected an integer, got 2.5",
        ),
        (
            {"workerClasses": [{"name": "cpu", "groupSeconds": 1}]},
            "workerClasses[0]: missing required key(s) count",
        ),
        (
            {
                "workerClasses": [
                    {"name": "a", "count": 1, "groupSeconds": 1},
                    {"name": "a", "count": 1, "groupSeconds": 1},
                ]
            },
            "workerClasses: names must be unique",
        ),
        (
            {"trainer": {"stepSeconds": 1, "publishSeconds": -2}},
            "trainer.publishSeconds: must be ≥ 0, got -2",
        ),
        (
            {"heartbeatInterval": 40, "leaseTimeout": 30},
            "heartbeatInterval (40s) must be shorter than leaseTimeout",
        ),
    ],
)
def test_invalid_values_are_errors_naming_the_key(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_mapping({**MINIMAL, **change})
    assert message in str(info.value)


def test_a_bad_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("mode: [unclosed")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_config(path)
    path.write_text("maxStaleness: 1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: configuration: missing required key"):
        load_config(path)


def test_variations() -> None:
    config: SimConfig = load_config(EXAMPLE).replace(mode="Sequential", refresh_threshold=2)
    assert config.with_max_staleness(1).refresh_threshold == 1  # kept ≤ Δmax
    assert config.with_max_staleness(4).refresh_threshold == 2
    assert config.scaled(2).pool_sizes() == {k: 2 * v for k, v in config.pool_sizes().items()}
    assert config.scaled(0.01).pool_sizes() == dict.fromkeys(config.pool_sizes(), 1)
    assert config.with_pools({"cpu": 0}).pool_sizes()["cpu"] == 0
    with pytest.raises(ConfigError, match="pool 'tpu' is not a worker class"):
        config.with_pools({"tpu": 3})
