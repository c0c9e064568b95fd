"""Build (and warm up) a job's model in a process of its own: ``echorl run`` calls this before it starts
the job's processes.

Building or warming up a built-in model imports torch; done in the runner itself, that torch would stay
in the runner's memory for the whole run (about 0.5 GiB), though the runner only starts and watches
processes. The manifest comes on standard input (the run's own, ``--seed`` applied); progress goes to
standard error; the resolved model directory is the last line on standard output.
"""

from __future__ import annotations

import sys

from echo_runtime import spec
from echo_runtime.spec import load as spec_load


def main() -> int:
    manifests = spec_load.load_documents(sys.stdin.read(), "<echorl run>")
    (job,) = [m for m in manifests if isinstance(m, spec.EchoJob)]
    resolved = spec.resolve(job, manifests)
    from echo_runtime.models import load as model_load

    print(model_load.resolve_spec(resolved.spec.model, resolved.spec.task), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
