"""``python -m echo_runtime.cli`` — the ``echorl`` command (torchrun and the local runner use this)."""

from echo_runtime.cli import main

main()
