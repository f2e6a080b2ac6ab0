"""Fixtures shared by unit tests."""

from __future__ import annotations

import pytest
import torch

from pipeline import distributed


@pytest.fixture
def one_rank(monkeypatch):
    """A one-rank gloo process group, as `pipeline.distributed.init` makes outside torchrun
    (torchrun's variables set for this test only); torn down after unless it existed."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(distributed.free_port()))
    already = torch.distributed.is_initialized()
    distributed.init()
    yield
    if not already:
        torch.distributed.destroy_process_group()
