"""``python -m echo_operator [kopf run options]``: run the operator (the same as ``echorl operator run``).

With no options it watches every namespace, standalone (one replica; no peering objects needed).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def kopf_argv(extra: Sequence[str]) -> list[str]:
    """The ``kopf run`` command line for the operator's handlers plus the given options."""
    argv = ["run", "--standalone", "-m", "echo_operator.handlers"]
    if not any(a in ("-A", "--all-namespaces") or a.startswith(("-n", "--namespace")) for a in extra):
        argv.append("--all-namespaces")
    return [*argv, *extra]


def main(argv: Sequence[str] | None = None) -> int:
    from kopf import cli

    args = kopf_argv(sys.argv[1:] if argv is None else argv)
    try:
        cli.main(args=args, prog_name="echorl operator run", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
