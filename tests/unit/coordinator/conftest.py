"""Fixtures of the coordinator's unit tests: tokens, a service, and that service on a loopback port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import uvicorn
from coordinator_helpers import CPU_TOKEN, GPU_TOKEN, TRAINER_TOKEN, config, make_state

from echo_runtime.coordinator import api, auth, service
from echo_runtime.coordinator.config import CoordinatorConfig


@pytest.fixture
def tokens() -> auth.TokenStore:
    return auth.TokenStore.from_mapping(
        {
            "trainer": TRAINER_TOKEN,
            "pools": {"cpu": CPU_TOKEN, "gpu": "sha256:" + auth.digest(GPU_TOKEN).hex()},
        }
    )


@pytest.fixture
def make_service(tokens: auth.TokenStore) -> Callable[..., api.Service]:
    def make(cfg: CoordinatorConfig | None = None, **kwargs: object) -> api.Service:
        cfg = cfg or config(pools=("cpu", "gpu"))
        return api.Service(make_state(cfg), tokens, **kwargs)  # type: ignore[arg-type]

    return make


@pytest.fixture
def serve() -> Iterator[Callable[[api.Service], str]]:
    """Serve a Service over real HTTP on a loopback port, in a thread; returns its base URL."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(svc: api.Service) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = uvicorn.Config(
            api.create_app(svc),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            http=service.http_protocol(),
            lifespan="on",
        )
        server = uvicorn.Server(cfg)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)
