"""scripts/env.sh, sourced as a user would in an interactive shell: it sets up the environment and
leaves the shell's own options alone, also when a step fails."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
source "$1"; echo "status=$?"
echo "flags=$-"; set -o | grep -E '^pipefail' ; echo "leftover=${_echorl_status-unset}${_echorl_options-unset}"
false; echo "still here"; echo "echorl=$(command -v echorl || true)"
"""


def _source(env: dict[str, str] | None = None, options: str = "set +e +u; set +o pipefail;") -> str:
    result = subprocess.run(
        ["bash", "-c", options + PROBE, "probe", str(ROOT / "scripts" / "env.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_sourcing_sets_up_the_environment_and_keeps_the_callers_options() -> None:
    out = _source()
    assert "status=0" in out
    flags = out.split("flags=", 1)[1].split("\n", 1)[0]
    assert "e" not in flags and "u" not in flags, flags
    assert re.search(r"^pipefail\s+off$", out, re.M), out
    assert "leftover=unsetunset" in out
    assert "still here" in out
    assert "/venv/" in out.split("echorl=", 1)[1]


def test_a_failing_step_returns_non_zero_without_closing_the_shell(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache directory should be")
    out = _source({**os.environ, "ECHORL_CACHE_DIR": str(blocked)})
    assert "status=1" in out
    assert "still here" in out
    flags = out.split("flags=", 1)[1].split("\n", 1)[0]
    assert "e" not in flags and "u" not in flags, flags


def test_a_script_running_with_errexit_keeps_it_after_sourcing() -> None:
    """scripts/test.sh runs `set -euo pipefail` and then sources env.sh: a failing linter must still stop it."""
    probe = (
        'set -euo pipefail; source "$1"; echo "flags=$-"; set -o | grep -E "^pipefail"; false; echo "went on"'
    )
    result = subprocess.run(
        ["bash", "-c", probe, "probe", str(ROOT / "scripts" / "env.sh")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    flags = result.stdout.split("flags=", 1)[1].split("\n", 1)[0]
    assert "e" in flags and "u" in flags, flags
    assert re.search(r"^pipefail\s+on$", result.stdout, re.M), result.stdout
    assert "went on" not in result.stdout and result.returncode != 0


def _checkout(root: Path, marker: str) -> Path:
    """A checkout with this one's scripts and pins (so the same environment) and its own code."""
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "env.sh").write_text((ROOT / "scripts" / "env.sh").read_text())
    (root / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for package in ("runtime/echo_runtime", "operator/echo_operator"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(f"MARKER = {marker!r}\n")
    return root


def test_two_checkouts_share_the_environment_but_each_imports_its_own_code(tmp_path: Path) -> None:
    """Sourcing another checkout's env.sh neither re-points the shared install nor leaks into this one."""
    installed = "import echo_runtime; print(echo_runtime.__file__)"
    other = _checkout(tmp_path / "other", "other")
    probe = 'source "$1" >/dev/null && python -c "import echo_runtime as e, echo_operator as o; print(e.__file__, o.__file__)"'
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def imports(checkout: Path) -> str:
        done = subprocess.run(
            ["bash", "-c", probe, "probe", str(checkout / "scripts" / "env.sh")],
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def shared_install() -> str:
        done = subprocess.run(
            ["bash", "-c", f'source "$1" >/dev/null && python -I -c "{installed}"', "probe", str(ROOT / "scripts" / "env.sh")],
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
        return done.stdout.strip()

    before = shared_install()
    assert (
        imports(other)
        == f"{other}/runtime/echo_runtime/__init__.py {other}/operator/echo_operator/__init__.py"
    )
    assert (
        imports(ROOT) == f"{ROOT}/runtime/echo_runtime/__init__.py {ROOT}/operator/echo_operator/__init__.py"
    )
    assert shared_install() == before  # nobody re-installed the project for its own checkout


FAKE_PYTHON = """#!/usr/bin/env bash
# A stand-in for python3.11 that makes a venv whose pip takes a second and logs its start and end.
if [ "$1" = "--version" ]; then echo "Python 3.11.0-fake"; exit 0; fi
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  printf '#!/usr/bin/env bash\\necho "start $$" >> "%s"; sleep 1; echo "end $$" >> "%s"\\n' "$LOG" "$LOG" > "$3/bin/pip"
  printf '#!/usr/bin/env bash\\nexit 0\\n' > "$3/bin/python"
  chmod +x "$3/bin/pip" "$3/bin/python"
  echo "venv $$" >> "$LOG"
  exit 0
fi
exit 1
"""


def test_two_first_calls_at_once_create_the_environment_once(tmp_path: Path) -> None:
    """Two shells sourcing env.sh on an empty cache: one creates, the other waits and finds it made."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3.11").write_text(FAKE_PYTHON)
    (fake / "python3.11").chmod(0o755)
    log = tmp_path / "log"
    env = {
        **os.environ,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "ECHORL_CACHE_DIR": str(tmp_path / "cache"),
        "LOG": str(log),
    }
    env.pop("PYTHONPATH", None)
    probe = 'source "$1"; echo "status=$?"'
    shells = [
        subprocess.Popen(
            ["bash", "-c", probe, "probe", str(ROOT / "scripts" / "env.sh")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outs = [shell.communicate(timeout=120)[0] for shell in shells]
    assert all("status=0" in out for out in outs), outs
    lines = log.read_text().split()
    assert lines.count("venv") == 1, lines  # made once
    events = [w for w in lines if w in ("start", "end")]
    assert events == ["start", "end", "start", "end"], events  # pip upgrade, then install: never overlapping
    assert len(list((tmp_path / "cache" / "venv").glob("*/.complete"))) == 1
