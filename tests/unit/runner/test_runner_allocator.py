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
def test_a_child_started_with_it_runs_on_jemalloc() -> None:
    env = allocator.child_env({})
    probe = "print(any('jemalloc' in line for line in open('/proc/self/maps')))"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "True"
    bare = subprocess.run(
        [sys.executable, "-c", probe], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert bare.stdout.strip() == "False"
