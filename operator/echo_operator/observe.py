"""Reading a job's coordinator: ``GET /v1/status`` (docs/contracts.md), once, with a short timeout.

The operator polls on its own timer, so a failed read is reported (:class:`Unreachable`) rather than
retried here. The request goes through :mod:`echo_runtime.coordinator.client`, the one HTTP client of
the coordinator, and the reply is the coordinator's own :class:`~echo_runtime.coordinator.wire.StatusDocument`.
The status endpoint wants a join token; the operator uses the trainer's, which it minted itself.
"""

from __future__ import annotations

from echo_runtime.coordinator import client, wire


class Unreachable(Exception):
    """The coordinator did not answer, refused the token, or sent something that is not a status."""


def fetch_status(url: str, token: str, timeout_s: float = 3.0) -> wire.StatusDocument:
    """The coordinator's status document; raises :class:`Unreachable` with the reason."""
    transport = client.Transport(
        url, token, timeout=timeout_s, retry=client.RetryPolicy(attempts=1, deadline=None)
    )
    try:
        return transport.call("GET", "/v1/status", wire.StatusDocument)
    except client.CoordinatorError as exc:
        raise Unreachable(exc.message if exc.code == "unavailable" else str(exc)) from exc
    except ValueError as exc:  # pydantic: not a status document
        raise Unreachable(f"GET {url}/v1/status: unexpected reply: {exc}") from exc
    finally:
        transport.close()
