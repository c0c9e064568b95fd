"""Real ``echorl scorer`` processes serving a classifier and a judge fine-tuned here (tests/reward_models.py),
called by the coordinator's client: the rewards are the models' (equal to scoring in this process), the
preference the models were taught shows, concurrent groups are batched, the token is required, and a
pool killed for real makes the coordinator's scorer refuse with 503 until it is back."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

import reward_models
from echo_runtime.coordinator import errors, scoring
from echo_runtime.rewards import models, pool
from echo_runtime.spec.rewards import RewardModel
from echo_runtime.tasks import base as tasks_base

TOKEN = "scorer-token-for-integration"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _job(tmp_path: Path, dirs: dict[str, Path]) -> tuple[Path, dict[str, RewardModel]]:
    rms = [
        {"name": "bang", "type": "Classifier", "model": str(dirs["classifier"]), "batchSize": 4, "threads": 1},
        {
            "name": "judge", "type": "Judge", "model": str(dirs["judge"]), "rubric": reward_models.JUDGE_RUBRIC,
            "maxNewTokens": 4, "batchSize": 8, "threads": 1, "weight": 2.0,
        },
    ]  # fmt: skip
    job = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "EchoJob",
        "metadata": {"name": "rm"},
        "spec": {"rewardModels": rms},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path, {m["name"]: RewardModel.model_validate(m) for m in rms}  # type: ignore[misc]


def _start(job: Path, name: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "echo_runtime.cli", "scorer", "--job", str(job), "--reward-model", name, "--port", str(port)],
        env={**os.environ, "ECHORL_SCORER_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"},
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise AssertionError(f"{url} never answered: {log.read_text()[-3000:]}")


@pytest.fixture
def scorers(
    tmp_path: Path, reward_model_dirs: dict[str, Path]
) -> Iterator[tuple[dict[str, str], dict[str, RewardModel], dict[str, subprocess.Popen[bytes]]]]:
    job, settings = _job(tmp_path, reward_model_dirs)
    urls, procs = {}, {}
    try:
        for name in settings:
            port = _port()
            procs[name] = _start(job, name, port, tmp_path / f"{name}.log")
            urls[name] = f"http://127.0.0.1:{port}"
        for name in settings:
            _healthy(urls[name], procs[name], tmp_path / f"{name}.log")
        yield urls, settings, procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_scoring_pools_give_the_models_rewards_batched_and_combined(
    scorers: tuple[dict[str, str], dict[str, RewardModel], dict[str, subprocess.Popen[bytes]]],
    reward_model_dirs: dict[str, Path],
) -> None:
    urls, settings, _ = scorers
    held = reward_models.pairs(12, seed=7)  # problems the models never saw

    async def go() -> tuple[list[list[tuple[float, str]]], list[list[tuple[float, str]]], scoring.Scores]:
        clients = {n: pool.PoolClient(settings[n], [urls[n]], TOKEN) for n in settings}
        bang = await asyncio.gather(*(clients["bang"].score(p, [c, r]) for p, c, r in held))
        judge = await asyncio.gather(*(clients["judge"].score(p, [c, r]) for p, c, r in held))

        class NoVerifier:
            async def score(self, problem: tasks_base.Problem, completions: object) -> scoring.Scores:
                return scoring.Scores(tuple(tasks_base.Reward(0.0) for _ in held[0][1:]))

            def close(self) -> None:
                pass

        combined = await pool.WithRewardModels(NoVerifier(), list(clients.values()), task_weight=1.0).score(
            tasks_base.Problem(id="p", prompt=held[0][0], answer=None), list(held[0][1:])
        )
        for c in clients.values():
            await c.close()
        return bang, judge, combined

    bang, judge, combined = asyncio.run(go())
    # The preference the models were taught, on problems they never saw.
    assert all(chosen[0] > rejected[0] for chosen, rejected in bang)
    assert [(c[0], r[0]) for c, r in judge] == [(0.9, 0.2)] * len(held)
    # The scoring process gives what the model gives in this process.
    local = models.load(str(reward_model_dirs["classifier"]), settings["bang"])
    here = local.score([(p, c) for p, c, _ in held])
    assert [b[0][0] for b in bang] == pytest.approx([h[0] for h in here], abs=1e-5)
    # Concurrent groups were merged into forward passes of at most batchSize completions.
    health = httpx.get(f"{urls['bang']}/healthz").json()
    assert health["scored"] == 2 * len(held) and health["batches"] < len(held)
    # Weighted mean: verifier 0 (weight 1), classifier (weight 1), judge (weight 2).
    chosen = combined.rewards[0]
    assert chosen.value == pytest.approx((0.0 + bang[0][0][0] + 2 * 0.9) / 4)
    assert chosen.components["judge"] == 0.9 and chosen.components["bang"] == pytest.approx(bang[0][0][0])
    assert (
        httpx.post(f"{urls['bang']}/v1/score", json={"prompt": "q", "completions": ["x"]}).status_code == 401
    )


def test_a_killed_scoring_pool_refuses_submissions_with_503_and_serves_again_once_restarted(
    scorers: tuple[dict[str, str], dict[str, RewardModel], dict[str, subprocess.Popen[bytes]]],
    tmp_path: Path,
) -> None:
    urls, settings, procs = scorers
    port = int(urls["bang"].rsplit(":", 1)[1])

    class Verifier:
        async def score(self, problem: tasks_base.Problem, completions: object) -> scoring.Scores:
            return scoring.Scores((tasks_base.Reward(1.0),))

        def close(self) -> None:
            pass

    def kill() -> None:
        os.killpg(procs["bang"].pid, signal.SIGKILL)
        procs["bang"].wait(timeout=30)

    def restart() -> None:
        procs["bang"] = _start(tmp_path / "job.yaml", "bang", port, tmp_path / "bang-again.log")
        _healthy(urls["bang"], procs["bang"], tmp_path / "bang-again.log")

    async def go() -> None:
        client = pool.PoolClient(settings["bang"], [urls["bang"]], TOKEN)
        scorer = pool.WithRewardModels(Verifier(), [client], task_weight=1.0)
        problem = tasks_base.Problem(id="p", prompt="What is 3 + 4?", answer=7)
        first = await scorer.score(problem, ["7 !"])
        await asyncio.to_thread(kill)
        with pytest.raises(errors.Rejected) as refused:
            await scorer.score(problem, ["8"])
        assert refused.value.status == 503 and refused.value.field == "rewardModels[bang]"
        assert (await scorer.score(problem, ["7 !"])).rewards == first.rewards  # cached: no call needed
        await asyncio.to_thread(restart)
        again = await scorer.score(problem, ["8"])
        assert (
            0.0 <= again.rewards[0].value < first.rewards[0].value and "bang" in again.rewards[0].components
        )
        await client.close()

    asyncio.run(go())
