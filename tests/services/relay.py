"""A loopback TCP relay in front of a test service: it can reset the first connections (a flaky network)
and pace each direction to a link rate (a throttled network). Used by the snapshot store's error tests
and by ``benchmarks/deltas.py``'s throttled readers."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class Relay:
    """Forward every connection to ``upstream`` (``host:port``); ``endpoint`` is the relay's own.

    ``drop``: reset (RST) the first ``drop`` connections, then forward faithfully.
    ``mbit``: pace each direction to this many Mbit/s — one token bucket per direction, shared by all
    connections, as on one access link (bandwidth only: no latency, no loss). ``None``: unpaced."""

    CHUNK = 64 * 1024

    def __init__(self, upstream: str, drop: int = 0, *, mbit: float | None = None) -> None:
        if mbit is not None and mbit <= 0:
            raise ValueError(f"mbit: must be > 0, got {mbit}")
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.remaining_drops = drop
        self.dropped = 0
        self.rate = None if mbit is None else mbit * 1e6 / 8  # bytes per second
        self._free = {"up": 0.0, "down": 0.0}  # when each direction's link is next idle
        self._lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed
            if self.remaining_drops > 0:
                self.remaining_drops -= 1
                self.dropped += 1
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()  # RST: the client sees "connection reset"
                continue
            upstream = socket.create_connection(self.upstream)
            for a, b, direction in ((conn, upstream, "up"), (upstream, conn, "down")):
                threading.Thread(target=self._pipe, args=(a, b, direction), daemon=True).start()

    def _pace(self, size: int, direction: str) -> None:
        if self.rate is None:
            return
        with self._lock:
            start = max(time.monotonic(), self._free[direction])
            self._free[direction] = done = start + size / self.rate
        time.sleep(max(0.0, done - time.monotonic()))

    def _pipe(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while data := src.recv(self.CHUNK):
                self._pace(len(data), direction)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()
