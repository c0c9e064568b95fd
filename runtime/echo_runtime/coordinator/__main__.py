"""``python -m echo_runtime.coordinator --job job.yaml ...``: the same as ``echorl coordinator``."""

from echo_runtime.cli.coordinator import coordinator

if __name__ == "__main__":
    coordinator(prog_name="echorl coordinator")
