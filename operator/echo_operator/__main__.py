"""``python -m echo_operator [kopf run options]``: run the operator (the same as ``echorl operator run``).

With no options it watches every namespace. kopf itself always runs standalone (no kopf peering);
with ``ECHORL_LEADER_ELECTION=true`` (the manifests' two replicas) this replica first waits for the
operator's Lease (:mod:`echo_operator.leader`), runs kopf while it holds it, ends the process if it
loses it, and releases it on a clean stop.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from echo_operator import leader

log = logging.getLogger("echo_operator")


def kopf_argv(extra: Sequence[str]) -> list[str]:
    """The ``kopf run`` command line for the operator's handlers plus the given options."""
    argv = ["run", "--standalone", "-m", "echo_operator.handlers"]
    if not any(a in ("-A", "--all-namespaces") or a.startswith(("-n", "--namespace")) for a in extra):
        argv.append("--all-namespaces")
    return [*argv, *extra]


def _run_kopf(args: list[str]) -> int:
    from kopf import cli

    try:
        cli.main(args=args, prog_name="echorl operator run", standalone_mode=True)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from echo_operator import leader, metrics

    args = kopf_argv(sys.argv[1:] if argv is None else argv)
    try:
        settings = leader.Settings.from_env()
        metrics.port_from_env()
    except ValueError as exc:
        print(f"echorl operator: {exc}", file=sys.stderr)
        return 2
    if settings is None:
        return _run_kopf(args)
    return _lead_then_run(settings, args)


def _lead_then_run(settings: leader.Settings, args: list[str]) -> int:
    from echo_operator import leader, metrics
    from echo_operator.kube import Kube

    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s] %(name)-20.20s [%(levelname)-8.8s] %(message)s"
    )
    elector = leader.Elector(Kube.from_environment(identity=settings.identity), settings)
    metrics.STATE.leader = elector.is_leader  # a follower's /metrics says 0
    metrics.serve(metrics.port_from_env())
    address = leader.liveness_address(args)
    health = leader.serve_health(address) if address is not None else None
    log.info("leader election: %s asks for Lease %s/%s", settings.identity, settings.namespace, settings.name)
    try:
        elector.acquire()
    finally:
        if health is not None:
            health.shutdown()
            health.server_close()

    def lost(reason: str) -> None:
        # Stop at once: the reconciler's writes are already fenced (Kube.fence); kopf's own bookkeeping
        # writes are not, so the process ends before a follower may take over. The Deployment restarts
        # it, as a follower.
        log.error("leader election: %s lost leadership (%s); exiting", settings.identity, reason)
        logging.shutdown()
        os._exit(1)

    def stop(signum: int, frame: object) -> None:
        # A SIGTERM between winning the Lease and kopf's start (kopf then handles it): stop cleanly, so
        # the finally below releases the Lease and the other replica need not wait it out.
        raise SystemExit(0)

    leader.set_current(elector)
    elector.keep(lost)
    signal.signal(signal.SIGTERM, stop)
    try:
        return _run_kopf(args)
    finally:
        elector.release()
        leader.set_current(None)


if __name__ == "__main__":
    sys.exit(main())
