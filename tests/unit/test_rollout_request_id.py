"""Request ids: built and parsed in one place (`pipeline.rollout.request_id`), and vLLM's
internal ids traced back to the caller's."""

from __future__ import annotations

import pytest

from pipeline.rollout.request_id import CHUNK_SEED_STRIDE, RequestId, caller_id


@pytest.mark.parametrize("rid, text", [(RequestId(0, 0), "0:0"), (RequestId(3, 7), "3:7"),
                                       (RequestId(12, 1, 0), "12:1:0"),
                                       (RequestId(5, 2, 14), "5:2:14")])
def test_an_id_and_its_text_round_trip(rid, text):
    assert str(rid) == text
    assert RequestId.parse(text) == rid
    assert RequestId.parse(str(rid)) == rid


@pytest.mark.parametrize("text", ["", "3", "3:", ":1", "3:1:2:0", "a:1", "3:-1", "3:1-abcd1234",
                                  " 3:1", "3:1\n"])
def test_other_text_is_not_a_request_id(text):
    with pytest.raises(ValueError, match="not a rollout request id"):
        RequestId.parse(text)


@pytest.mark.parametrize("text", ["3:0", "3:0:1", "0", "17"])
def test_vllm_suffix_is_stripped_back_to_the_callers_id(text):
    """vLLM 0.32 makes its internal id `{caller's id}-{8 hex characters}`."""
    assert caller_id(f"{text}-a1b2c3d4") == text
    assert caller_id(f"{text}-00000000") == text


@pytest.mark.parametrize("text", ["3:0:1", "0", "rhymectl-warm-3", "x-a1b2c3d", "x-A1B2C3D4"])
def test_an_id_without_vllm_suffix_is_left_alone(text):
    """Randomisation off (VLLM_DISABLE_REQUEST_ID_RANDOMIZATION), or a caller's id with a
    dash of its own: only a dash and exactly 8 lower-case hex characters are vLLM's."""
    assert caller_id(text) == text


def test_the_internal_id_of_a_request_parses_back_to_it():
    rid = RequestId(4, 1, 2)
    assert RequestId.parse(caller_id(f"{rid}-9f8e7d6c")) == rid


def test_request_seeds_are_the_ones_earlier_runs_drew():
    """Resumed runs and the fault chain compare rows with earlier runs bit for bit: these
    numbers are the seeds vLLM was given before request ids had a type (step seed S,
    group size n: S + g * n + s, plus 1_000_003 per chunk)."""
    step_seed = (1 * 1_000_003 + 2) * 65_536  # run.seed 1, step 2 (`pipeline.loop.step`)
    assert step_seed == 65_536_327_680
    assert RequestId(0, 0).seed(step_seed, 8) == 65_536_327_680
    assert RequestId(3, 5).seed(step_seed, 8) == 65_536_327_709
    assert RequestId(3, 5, 0).seed(step_seed, 8) == 65_536_327_709  # chunk 0: the whole response's
    assert RequestId(3, 5, 2).seed(step_seed, 8) == 65_538_327_715
    assert RequestId(1, 0).seed(7, 4) == 11 and RequestId(1, 0, 1).seed(7, 4) == 1_000_014
    assert CHUNK_SEED_STRIDE == 1_000_003
    assert RequestId(2, 1).seed(None, 8) is None and RequestId(2, 1, 3).seed(None, 8) is None


def test_every_request_of_a_step_gets_its_own_seed():
    seeds = [RequestId(g, s, c).seed(0, 4) for g in range(50) for s in range(4) for c in range(5)]
    assert len(set(seeds)) == len(seeds)
