"""Join tokens (coordinator.auth): hashed storage, constant-time checks, the tokens file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from echo_runtime.coordinator import auth

TOKEN = "a-long-enough-token-123"


def test_tokens_are_stored_only_hashed(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(
        f"trainer: {TOKEN}\npools:\n  cpu: sha256:{hashlib.sha256(b'cpu-token-abcdefgh').hexdigest()}\n"
    )
    store = auth.TokenStore.load(path)
    assert store.trainer == hashlib.sha256(TOKEN.encode()).digest()
    assert TOKEN not in repr(store)
    assert store.is_trainer(TOKEN) and not store.is_trainer("cpu-token-abcdefgh")
    assert store.is_pool("cpu", "cpu-token-abcdefgh") and not store.is_pool("gpu", "cpu-token-abcdefgh")
    assert store.is_known(TOKEN) and store.is_known("cpu-token-abcdefgh") and not store.is_known("nope")
    assert not store.is_known(None)
    assert store.missing_pools(["cpu", "gpu"]) == ["gpu"]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ([], "must be a mapping"),
        ({"pools": {"cpu": TOKEN}}, "'trainer' is missing"),
        ({"trainer": TOKEN}, "'pools'"),
        ({"trainer": TOKEN, "pools": {"cpu": "short"}}, "pools.cpu: a token needs at least 16"),
        ({"trainer": TOKEN, "pools": {"cpu": "sha256:abc"}}, "64 lowercase hex"),
        ({"trainer": 5, "pools": {"cpu": TOKEN}}, "trainer: must be a string"),
        ({"trainer": TOKEN, "pools": {"cpu": TOKEN}, "extra": 1}, "unknown key"),
    ],
)
def test_bad_token_files_say_what_is_wrong(data: object, words: str) -> None:
    with pytest.raises(auth.TokenError, match=words):
        auth.TokenStore.from_mapping(data)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(auth.TokenError, match="cannot read"):
        auth.TokenStore.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed")
    with pytest.raises(auth.TokenError, match="not valid"):
        auth.TokenStore.load(bad)


def test_bearer_header_parsing_and_generated_tokens() -> None:
    assert auth.bearer(f"Bearer {TOKEN}") == TOKEN
    assert auth.bearer(f"bearer  {TOKEN} ") == TOKEN
    assert auth.bearer("Basic xyz") is None and auth.bearer("") is None and auth.bearer("Bearer ") is None
    generated = auth.generate(["cpu", "macs"])
    store = auth.TokenStore.from_mapping(generated)
    assert store.is_pool("macs", generated["pools"]["macs"]) and len(generated["trainer"]) >= 40
    assert auth.matches("x", auth.digest("x")) and not auth.matches(None, auth.digest("x"))


def test_the_status_token_is_optional_and_known_but_no_join_token() -> None:
    status = "a-read-only-status-token"
    store = auth.TokenStore.from_mapping(
        {"trainer": TOKEN, "pools": {"cpu": "cpu-token-abcdefgh"}, "status": status}
    )
    assert store.is_status(status) and store.is_known(status)
    assert not store.is_trainer(status) and not store.is_pool("cpu", status)
    assert not store.is_status(TOKEN)
    without = auth.TokenStore.from_mapping({"trainer": TOKEN, "pools": {"cpu": "cpu-token-abcdefgh"}})
    assert without.status is None and not without.is_status(status) and not without.is_known(status)
    with pytest.raises(auth.TokenError, match="status: a token needs at least 16"):
        auth.TokenStore.from_mapping({"trainer": TOKEN, "pools": {"cpu": TOKEN}, "status": "short"})
