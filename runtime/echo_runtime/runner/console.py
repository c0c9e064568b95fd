"""What a local run shows on the terminal while it runs: one progress line.

The line is tqdm's (STYLE.md: the well-kept library), one step per policy version, with the latest
reward, held-out accuracy, rollouts/s, observed staleness against Δmax, dropped groups and restarts.
Both arrangements of ``echorl run`` draw it (:mod:`.local` from the coordinator's status document,
:mod:`.colocated` from its own records of the same shape), so they look alike.
"""

from __future__ import annotations

from typing import Any


class ProgressBar:
    """The run's progress line; ``enabled=False`` draws nothing (``echorl run --no-progress``)."""

    def __init__(self, total: int, enabled: bool) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            total=total, unit="step", dynamic_ncols=True, disable=not enabled, desc="policy version"
        )
        self._n = 0

    def update_to(
        self, version: int, doc: dict[str, Any], accuracy: float | None, restarted: dict[str, int]
    ) -> None:
        if version > self._n:
            self._bar.update(version - self._n)
            self._n = version
        reward = doc.get("reward")
        self._bar.set_postfix(
            reward="-" if reward is None else f"{reward:.2f}",
            heldout="-" if accuracy is None else f"{accuracy:.2f}",
            rps=f"{doc.get('rolloutsPerSecond', 0.0):.1f}",
            stale=f"{doc.get('maxObservedStaleness')}/{doc.get('maxStaleness')}",
            dropped=doc.get("droppedStale", 0),
            **({"restarts": ",".join(f"{k}:{v}" for k, v in restarted.items())} if restarted else {}),
            refresh=False,
        )

    def close(self) -> None:
        self._bar.close()
