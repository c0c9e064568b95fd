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
