"""Which memory allocator a local run's processes use: jemalloc when the machine has it.

A CPU training step allocates and frees activations of many sizes. glibc's ``malloc`` reuses freed
blocks of one size poorly for the next, so the trainer's peak stands well above what the step holds
live; jemalloc's size classes do not. Measured on ``examples/smollm2.yaml`` (one trainer step in a
fresh process, micro-batches of 8, 2 threads; ``docs/benchmarks/memory-smollm2.md``):

* glibc: peak 3174 MiB, 3.0 GiB resident between steps, 6.7–6.8 s a step;
* jemalloc with :data:`MALLOC_CONF`: peak 2212 MiB, 1.6 GiB between steps, 6.5–6.9 s;
* glibc returning every block of 64 KiB or more (``MALLOC_MMAP_THRESHOLD_=65536``): peak 2140 MiB but
  9.7–11 s a step (the kernel zeroes every new mapping); jemalloc that never returns pages grows.

``echorl run`` starts its processes with ``LD_PRELOAD`` set to the first of :data:`JEMALLOC` that
exists (Debian's and Ubuntu's ``libjemalloc2``, Fedora's ``jemalloc``), unless ``ECHORL_MALLOC=system``
asks for the C library's allocator or the user preloads something already; ``MALLOC_CONF`` is left
alone when the user set it. Without jemalloc installed nothing changes. One exception: a Colocated run
samples and trains in ``echorl run``'s own process, which is already running when it could choose an
allocator, so only its evaluator gets jemalloc (preload it yourself to give it to the rest).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

ENV = "ECHORL_MALLOC"
"""``auto`` (the default): jemalloc when installed; ``system``: the C library's allocator."""
JEMALLOC = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
)
MALLOC_CONF = "dirty_decay_ms:30000,muzzy_decay_ms:30000,narenas:2"
"""Freed pages go back to the system after 30 s unused (a step reuses them first); two arenas."""


def child_env(environ: Mapping[str, str], candidates: Iterable[str] = JEMALLOC) -> dict[str, str]:
    """The variables that give a child process jemalloc (empty: it keeps the C library's allocator)."""
    choice = environ.get(ENV, "auto").strip().lower()
    if choice not in ("auto", "system"):
        raise ValueError(
            f"{ENV}: expected 'auto' (jemalloc when installed, the default) or 'system', got {choice!r}"
        )
    if choice == "system" or environ.get("LD_PRELOAD"):
        return {}
    found = next((path for path in candidates if Path(path).is_file()), None)
    if found is None:
        return {}
    out = {"LD_PRELOAD": found}
    if "MALLOC_CONF" not in environ:
        out["MALLOC_CONF"] = MALLOC_CONF
    return out


def in_use(maps: str | Path = "/proc/self/maps") -> str:
    """The allocator this process runs on, from the libraries it has mapped: ``jemalloc (<path>)`` or
    ``the C library's malloc``. The trainer and the worker log it at start: in a container that is how
    one sees what an image's ``LD_PRELOAD`` gave them (``images/README.md``)."""
    try:
        text = Path(maps).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown (no /proc)"
    for line in text.splitlines():
        path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
        if "libjemalloc" in Path(path).name:
            return f"jemalloc ({path})"
    return "the C library's malloc"


def describe(env: Mapping[str, str]) -> str:
    """One phrase for the run's banner."""
    return f"jemalloc ({env['LD_PRELOAD']})" if env.get("LD_PRELOAD") else "the C library's malloc"
