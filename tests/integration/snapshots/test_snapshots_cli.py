"""``echorl snapshots ls|show|gc`` on a local store and on MinIO, named by flags or by a job file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from snapshots_testing import Target, write_payload

from echo_runtime.cli.snapshots import snapshots
from echo_runtime.snapshots.store import SnapshotStore
from services.minio import MinioBucket


def _fill(store: SnapshotStore, tmp_path: Path, versions: int = 5) -> None:
    src = write_payload(tmp_path / "src", 1, [2048, 10])
    for version in range(1, versions + 1):
        store.publish(version, src, kind="lora", base_model="echorl:tiny")
    store.pin(2, "worker-a", ttl_s=3600)
    store.save_checkpoint(40, src / "part-1.bin")


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(snapshots, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.output


def test_local_ls_show_gc(tmp_path: Path) -> None:
    store = Target("local", path=str(tmp_path / "store")).open("quick")
    _fill(store, tmp_path)
    flags = ["--storage", str(tmp_path / "store"), "--job", "quick"]

    code, out = _run("ls", *flags)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split() == ["VERSION", "KIND", "STEP", "FILES", "SIZE", "CREATED", "PINNED", "BY"]
    assert [line.split()[0] for line in lines[1:6]] == ["1", "2", "3", "4", "5"]
    assert "worker-a" in lines[2] and "2.0 KiB" in lines[1]
    assert "latest: 5" in lines[-1]

    code, out = _run("ls", *flags, "--json")
    docs = [json.loads(line) for line in out.splitlines()]
    assert [d["version"] for d in docs] == [1, 2, 3, 4, 5] and docs[1]["pinnedBy"] == ["worker-a"]

    code, out = _run("ls", *flags, "--checkpoints")
    assert code == 0 and out.splitlines()[1].split()[:2] == ["40", "checkpoint"]

    code, out = _run("show", *flags)
    assert code == 0 and out.startswith("version 5 of job 'quick'")
    assert store.manifest(5).files[0].sha256 in out
    code, out = _run("show", "2", *flags)
    assert "pinned by:  worker-a (expires in" in out

    code, out = _run("gc", *flags, "--keep-last", "2", "--dry-run")
    assert code == 0 and "versions would remove: 1, 3" in out and "(pinned: 2)" in out
    assert store.versions() == [1, 2, 3, 4, 5]
    code, out = _run("gc", *flags, "--keep-last", "2")
    assert code == 0 and "versions removed: 1, 3" in out
    assert store.versions() == [2, 4, 5]


def test_job_file_names_the_store_and_retention(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text(
        "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: from-file}\n"
        "spec:\n  storage: {type: Local, path: mystore}\n"
        "  syncPolicy: {retention: {keepLast: 3}}\n"
    )
    store = Target("local", path=str(tmp_path / "mystore")).open("from-file")
    _fill(store, tmp_path)
    code, out = _run("gc", "--job-file", "job.yaml")
    assert code == 0, out
    assert store.versions() == [2, 3, 4, 5]  # keepLast 3, plus the pinned version 2


@pytest.mark.services
def test_s3_store(minio: MinioBucket, tmp_path: Path) -> None:
    target = Target.of_bucket(minio, prefix="team")
    _fill(target.open("quick"), tmp_path, versions=3)
    env = {"ECHORL_S3_ACCESS_KEY": minio.access_key, "ECHORL_S3_SECRET_KEY": minio.secret_key}
    flags = ["--storage", f"s3://{minio.bucket}/team", "--endpoint", minio.url, "--job", "quick"]
    code, out = _run("ls", *flags, env=env)
    assert code == 0, out
    assert f"3 snapshot(s) of job 'quick' in s3://{minio.bucket}/team at {minio.url}; latest: 3" in out

    code, out = _run("ls", *flags, env={**env, "ECHORL_S3_SECRET_KEY": "wrong-secret"})
    assert code == 1 and "rejected the request" in out and "SignatureDoesNotMatch" in out

    code, out = _run(
        "ls", "--storage", f"s3://{minio.bucket}-nope", "--endpoint", minio.url, "--job", "quick", env=env
    )
    assert code == 1 and "does not exist on" in out


def test_usage_errors(tmp_path: Path) -> None:
    code, out = _run("ls", "--job", "x")
    assert code == 2 and "name the store" in out
    code, out = _run("ls", "--storage", str(tmp_path))
    assert code == 2 and "name the job" in out
    code, out = _run(
        "ls", "--storage", "s3://bucket", "--job", "x", env={"ECHORL_S3_ENDPOINT": "", "AWS_ENDPOINT_URL": ""}
    )
    assert code == 2 and "--endpoint" in out
    code, out = _run("ls", "--storage", "s3://Bad_Bucket", "--endpoint", "http://h:1", "--job", "x")
    assert code == 2 and "bucket" in out
    code, out = _run("ls", "--storage", str(tmp_path), "--job", "bad/job")
    assert code == 2 and "job: must be" in out
    code, out = _run("show", "--storage", str(tmp_path), "--job", "x")
    assert code == 1 and "no snapshots of job 'x'" in out
    code, out = _run("show", "nine", "--storage", str(tmp_path), "--job", "x")
    assert code == 2 and "expected a version number" in out
    code, out = _run("ls", "--storage", str(tmp_path), "--job", "x")
    assert code == 0 and "no snapshots of job 'x'" in out
