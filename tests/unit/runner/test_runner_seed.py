"""``echorl run --seed``: the manifest every process reads carries the seed; bench sync seeds the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from echo_runtime import spec
from echo_runtime.runner import local
from echo_runtime.spec import load as spec_load

ROOT = Path(__file__).resolve().parents[3]


def test_the_seed_reaches_the_manifest_the_processes_read(tmp_path: Path) -> None:
    source = ROOT / "examples" / "quickstart.yaml"
    run = local.LocalRun(source, local.RunOptions(run_dir=tmp_path / "run", seed=7), echo=lambda _: None)
    assert run.job.spec.algorithm.seed == 7
    written = [d for d in yaml.safe_load_all(run.manifest) if d]
    original = [d for d in yaml.safe_load_all(source.read_text()) if d]
    assert len(written) == len(original)  # referenced objects travel unchanged
    (job,) = [d for d in written if d["kind"] == "EchoJob"]
    assert job["spec"]["algorithm"]["seed"] == 7
    (before,) = [d for d in original if d["kind"] == "EchoJob"]
    before["spec"].setdefault("algorithm", {})["seed"] = 7
    assert job == before  # nothing else changed
    resolved = spec.resolve(
        *[m for m in spec_load.load_documents(run.manifest) if isinstance(m, spec.EchoJob)]
    )
    assert resolved.spec.algorithm.seed == 7


def test_without_a_seed_the_users_file_is_copied_as_it_is(tmp_path: Path) -> None:
    source = ROOT / "examples" / "quickstart.yaml"
    run = local.LocalRun(source, local.RunOptions(run_dir=tmp_path / "run"), echo=lambda _: None)
    assert run.manifest == source.read_text()


def test_seeded_refuses_what_is_not_a_seed_and_leaves_the_input_alone() -> None:
    doc = {"kind": "EchoJob", "spec": {"algorithm": {"seed": 1, "maxSteps": 3}}}
    assert spec_load.seeded(doc, 4)["spec"]["algorithm"] == {"seed": 4, "maxSteps": 3}
    assert doc["spec"]["algorithm"]["seed"] == 1
    assert spec_load.seeded({"kind": "EchoJob"}, 0)["spec"] == {"algorithm": {"seed": 0}}
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="seed: must be an integer ≥ 0"):
            spec_load.seeded(doc, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"spec\.algorithm: must be a mapping"):
        spec_load.seeded({"spec": {"algorithm": 3}}, 1)


def test_a_file_with_two_jobs_cannot_take_one_seed(tmp_path: Path) -> None:
    source = ROOT / "examples" / "quickstart.yaml"
    (job,) = [d for d in yaml.safe_load_all(source.read_text()) if d and d["kind"] == "EchoJob"]
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump_all([job, {**job, "metadata": {"name": "other"}}]))
    with pytest.raises(local.RunError, match="exactly one EchoJob, found 2"):
        local.run_manifest(two, 3)
