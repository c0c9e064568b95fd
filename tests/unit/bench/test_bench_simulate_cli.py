"""``echorl simulate``: the sweep table, the JSON and the plot, and errors a user can act on."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from echo_runtime.cli.simulate import simulate

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = str(REPO / "examples" / "simulate" / "heterogeneous.yaml")


def test_sweep_prints_a_table_and_writes_json_and_a_plot(tmp_path: Path) -> None:
    out, plot = tmp_path / "results.json", tmp_path / "sim.png"
    result = CliRunner().invoke(
        simulate,
        [
            EXAMPLE,
            "--max-staleness",
            "0,4",
            "--pool",
            "m4pro=0,40",
            "--duration",
            "900",
            "--out",
            str(out),
            "--plot",
            str(plot),
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("Async mode, batch 64 groups × 8, 900 s simulated")
    assert lines[1].split()[:4] == ["Δmax", "pools", "buffer", "rollouts/s"]
    rows = [line for line in lines if line[:1].isdigit()]
    assert len(rows) == 4  # 2 pool variants × 2 Δmax
    document = json.loads(out.read_text())
    points = document["points"]
    assert [(p["maxStaleness"], p["pools"]["m4pro"]) for p in points] == [(0, 0), (4, 0), (0, 40), (4, 40)]
    assert all(p["violations"] == 0 for p in points)
    assert all(int(s) <= p["maxStaleness"] for p in points for s in p["stalenessHistogram"])
    assert plot.stat().st_size > 10_000


def test_seeds_and_scale_and_mode(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        simulate,
        [
            EXAMPLE,
            "--scale",
            "0.5",
            "--seeds",
            "2",
            "--mode",
            "Sequential",
            "--duration",
            "600",
            "--out",
            str(tmp_path / "r.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "Sequential mode" in result.output and "±" in result.output
    point = json.loads((tmp_path / "r.json").read_text())["points"][0]
    assert point["pools"] == {"h100": 1, "rtx5090": 2, "m4pro": 20, "cpu": 10}
    assert point["seeds"] == 2 and len(point["runs"]) == 2


def test_errors_name_what_was_wrong(tmp_path: Path) -> None:
    bad = CliRunner().invoke(simulate, [EXAMPLE, "--pool", "tpu=4"])
    assert bad.exit_code == 2 and "NAME one of cpu, h100, m4pro, rtx5090" in bad.output
    bad = CliRunner().invoke(simulate, [EXAMPLE, "--max-staleness", "0,two"])
    assert bad.exit_code == 2 and "comma-separated integers" in bad.output
    config = tmp_path / "c.yaml"
    config.write_text("trainer: {stepSeconds: 1}\nworkerClasses: [{name: a, count: 1, groupSeconds: -1}]\n")
    bad = CliRunner().invoke(simulate, [str(config)])
    assert bad.exit_code == 1 and "workerClasses['a'].groupSeconds: must be > 0, got -1" in bad.output
