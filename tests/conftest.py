"""Shared settings and the test tiers, set by folder:

- `tests/unit`: pure logic, no engine and no model fixture (`make test-fast`, < 1 minute);
  every test there carries the `unit` marker.
- `tests/engine`: real vLLM / DeepSpeed / torchrun on the tiny model (built once per
  session by `tests/engine/conftest.py`); every test there carries the `engine` marker,
  and those that start DeepSpeed also `deepspeed`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "engine")


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
