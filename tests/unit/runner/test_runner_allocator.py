"""runner.allocator: when ``echorl run`` gives its processes jemalloc, and that the preload takes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from echo_runtime.runner import allocator


def test_jemalloc_when_installed_with_echos_settings(tmp_path: Path) -> None:
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    missing = str(tmp_path / "nowhere.so")
    assert allocator.child_env({}, [missing, str(lib)]) == {
        "LD_PRELOAD": str(lib),
        "MALLOC_CONF": allocator.MALLOC_CONF,
    }
    assert allocator.child_env({"MALLOC_CONF": "narenas:1"}, [str(lib)]) == {"LD_PRELOAD": str(lib)}


@pytest.mark.parametrize(
    "environ",
    [{"ECHORL_MALLOC": "system"}, {"LD_PRELOAD": "/opt/mine.so"}],
    ids=["asked-for-the-system-allocator", "the-user-preloads-already"],
)
def test_left_alone_when_the_user_chooses(environ: dict[str, str], tmp_path: Path) -> None:
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    assert allocator.child_env(environ, [str(lib)]) == {}


def test_nothing_changes_without_jemalloc(tmp_path: Path) -> None:
    assert allocator.child_env({}, [str(tmp_path / "absent.so")]) == {}
    assert allocator.describe({}) == "the C library's malloc"


def test_a_bad_choice_names_the_variable_and_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"ECHORL_MALLOC: expected 'auto'.*'system', got 'fast'"):
        allocator.child_env({"ECHORL_MALLOC": "fast"})


@pytest.mark.skipif(
    not any(Path(p).is_file() for p in allocator.JEMALLOC), reason="jemalloc is not installed here"
)
def test_a_child_started_with_it_runs_on_jemalloc_and_says_so() -> None:
    env = allocator.child_env({})
    probe = "from echo_runtime.runner import allocator; print(allocator.in_use())"
    runtime = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(allocator.__file__).parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={**runtime, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == f"jemalloc ({Path(env['LD_PRELOAD']).resolve()})"
    bare = subprocess.run([sys.executable, "-c", probe], env=runtime, capture_output=True, text=True)
    assert bare.stdout.strip() == "the C library's malloc"


def test_in_use_reads_the_mapped_libraries(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f10 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f20-7f30 r--p 00000000 08:01 13 /opt/echorl-malloc/libjemalloc.so.2\n"
        "7f40-7f50 rw-p 00000000 00:00 0 \n"
    )
    assert allocator.in_use(maps) == "jemalloc (/opt/echorl-malloc/libjemalloc.so.2)"
    maps.write_text("7f00-7f10 r-xp 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert allocator.in_use(maps) == "the C library's malloc"
    assert allocator.in_use(tmp_path / "absent").startswith("unknown")


@pytest.mark.parametrize("image", ["trainer", "worker-cpu"])
def test_the_images_preload_jemalloc_with_the_settings_echorl_run_uses(image: str) -> None:
    """The trainer and worker images run every process on jemalloc, configured as a local run's."""
    dockerfile = (Path(__file__).parents[3] / "images" / f"{image}.Dockerfile").read_text()
    env = {
        key: value
        for line in dockerfile.splitlines()
        if line.startswith("ENV LD_PRELOAD=")
        for key, _, value in (item.partition("=") for item in line.removeprefix("ENV ").split())
    }
    assert env.get("MALLOC_CONF") == allocator.MALLOC_CONF, env
    assert Path(env["LD_PRELOAD"]).name == "libjemalloc.so.2"
    assert f'ln -s "$lib" {env["LD_PRELOAD"]}' in dockerfile
