"""The coordinator's trust checks (coordinator.trust): token ids are the scored text, claims are vouched.

The tokenizer is the built-in tiny model's, loaded the way ``echorl coordinator`` loads a job's
(``service.load_detokenizer``), and the honest rollouts come from it: the ids of a completion as a
backend produces them, cut at the end-of-sequence token.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_runtime.backends import sampling
from echo_runtime.coordinator import service, trust
from echo_runtime.models import build
from echo_runtime.models import load as model_load
from echo_runtime.spec import load_job


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, trust.Detokenizer, object]:
    path = str(build.init_model("tiny", tmp_path_factory.mktemp("trust") / "tiny", seed=0))
    job_file = tmp_path_factory.mktemp("job") / "job.yaml"
    job_file.write_text(
        "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: trust}\n"
        f"spec: {{model: {{path: {path}}}, inferenceSwarms: [{{name: cpu}}]}}\n"
    )
    return path, service.load_detokenizer(load_job(Path(job_file))), model_load.load_tokenizer(path)


def honest(tokenizer: object, text: str, stop: bool, eos: frozenset[int]) -> list[int]:
    ids = list(tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]
    return [*ids, min(eos)] if stop else ids


def test_honest_ids_pass_both_ways_a_completion_ends(tiny: tuple[str, trust.Detokenizer, object]) -> None:
    _, check, tokenizer = tiny
    ids = honest(tokenizer, "42", stop=True, eos=check.eos_ids)
    assert check.refusal("rollouts[0]", ids, "42", "stop") is None
    assert check.refusal("rollouts[0]", ids, "42", None) is None
    assert check.refusal("rollouts[1]", ids[:-1], "42", "length") is None
    # What sampling.finish makes of a stream is, by construction, what the check accepts.
    sample = sampling.finish(tokenizer, [1], [*ids, 5, 6], [-0.1] * (len(ids) + 2), check.eos_ids)
    assert check.refusal("r", sample.completion_ids, sample.text, sample.finish_reason) is None


def test_the_right_text_with_other_ids_is_refused(tiny: tuple[str, trust.Detokenizer, object]) -> None:
    _, check, tokenizer = tiny
    other = honest(tokenizer, "17", stop=True, eos=check.eos_ids)
    problem = check.refusal("rollouts[3]", other, "42", "stop")
    assert problem is not None and problem[0] == "rollouts[3].tokenIds"
    assert "decode to '17', not to the completion '42'" in problem[1]
    assert trust.reason_of(problem[0]) == "tokenMismatch"


def test_a_stream_that_does_not_end_as_a_backend_ends_one_is_refused(
    tiny: tuple[str, trust.Detokenizer, object],
) -> None:
    _, check, tokenizer = tiny
    eos = min(check.eos_ids)
    ids = honest(tokenizer, "42", stop=False, eos=check.eos_ids)
    early = check.refusal("rollouts[0]", [ids[0], eos, *ids[1:], eos], "42", "stop")
    assert early is not None and early[0] == "rollouts[0].tokenIds[1]" and "before the last token" in early[1]
    liar = check.refusal("rollouts[0]", ids, "42", "stop")
    assert liar is not None and liar[0] == "rollouts[0].finishReason"


def test_a_claimed_version_must_have_been_told_or_reported() -> None:
    assert trust.version_refusal("rollouts[0]", 3, {0, 3}) is None
    problem = trust.version_refusal("rollouts[2]", 7, {0, 3, 5})
    assert problem is not None and problem[0] == "rollouts[2].policyVersion"
    assert "never told to load version 7" in problem[1] and "latest known: 0, 3, 5" in problem[1]
    assert trust.reason_of(problem[0]) == "unloadedVersion"


def test_rejections_are_counted_per_pool_and_reason() -> None:
    counters = trust.PoolCounters()
    counters.add("mac", "tokenMismatch")
    counters.add("mac", "tokenMismatch")
    counters.add("gpu", "unloadedVersion")
    assert counters.of("mac") == {"tokenMismatch": 2, "unloadedVersion": 0}
    assert counters.of("gpu") == {"tokenMismatch": 0, "unloadedVersion": 1}
    assert counters.of("cpu") == {"tokenMismatch": 0, "unloadedVersion": 0}


def test_a_group_is_checked_in_order_and_only_trust_problems_are_counted() -> None:
    from echo_runtime.coordinator import wire

    def group(**change: object) -> wire.SubmitRequest:
        good = {"completion": "7", "token_ids": [1, 2], "logprobs": [-0.5, -0.5], "policy_version": 1}
        return wire.SubmitRequest(rollouts=[wire.RolloutIn(**good), wire.RolloutIn(**{**good, **change})])

    check = {"group_size": 2, "max_new_tokens": 4, "vocab_size": 10, "published": 2, "detokenizer": None}
    assert trust.group_refusal(group(), known_versions={1}, **check) is None  # type: ignore[arg-type]
    cases = [
        ({"token_ids": [1, 2, 3, 4, 5], "logprobs": [-1.0] * 5}, "rollouts[1].tokenIds", None),
        ({"logprobs": [-0.5]}, "rollouts[1].logprobs", None),
        ({"token_ids": [1, 12]}, "rollouts[1].tokenIds[1]", None),
        ({"policy_version": 3}, "rollouts[1].policyVersion", None),  # never published: malformed
        ({"policy_version": 0}, "rollouts[1].policyVersion", "unloadedVersion"),  # published, not given
    ]
    for change, field, reason in cases:
        problem = trust.group_refusal(group(**change), known_versions={1}, **check)  # type: ignore[arg-type]
        assert problem is not None and (problem.field, problem.reason) == (field, reason), change


def test_a_claim_below_the_forgotten_floor_passes_the_version_check_to_be_dropped_as_stale() -> None:
    assert trust.version_refusal("rollouts[0]", 2, {5, 6}, floor=5) is None
    assert trust.version_refusal("rollouts[0]", 7, {5, 6}, floor=5) is not None  # in the window
