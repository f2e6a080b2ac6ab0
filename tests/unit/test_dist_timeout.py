"""The process group's collective timeout comes from `run.dist_timeout_min`.

torch's default is 10 minutes for NCCL (30 for gloo), while the other ranks wait in a barrier
as rank 0 builds the index, exports a 7B policy or writes and prunes checkpoints on shared
storage: a slow filesystem would abort a healthy run. A torch.distributed subgroup does not
inherit the world group's timeout (`new_group` falls back to the backend's default), so the
TP subgroups get it too."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed

from pipeline import distributed
from pipeline.config import load_config
from pipeline.config.schema import RunConfig
from pipeline.loop import run as loop_run
from pipeline.loop.tp_groups import TPLayout, new_groups


def test_the_default_is_an_hour():
    assert RunConfig().dist_timeout_min == 60


def test_init_passes_the_timeout_to_init_process_group(monkeypatch):
    seen = {}
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kw: seen.update(kw))
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 1)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"):
        monkeypatch.setenv(name, "0" if name != "MASTER_ADDR" else "127.0.0.1")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert distributed.init(timeout_min=45) == (0, 1)
    assert seen["timeout"] == timedelta(minutes=45)
    assert seen["backend"] == "gloo"


def test_a_training_run_starts_its_group_with_the_configs_timeout(monkeypatch):
    class Started(Exception):
        pass

    seen = []

    def init(**kw):
        seen.append(kw)
        raise Started

    monkeypatch.setattr(loop_run.dist, "init", init)
    cfg = load_config("sample_configs/tiny.yaml", ["run.dist_timeout_min=90"])
    with pytest.raises(Started):
        loop_run.run(cfg, resume=False, force=False)
    assert seen == [{"timeout_min": 90}]


def test_tp_subgroups_get_the_timeout_too(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.distributed, "new_group", lambda ranks, **kw: seen.append(kw))
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 0)
    new_groups(TPLayout(4, 2), timeout_min=90)
    assert seen == [{"timeout": timedelta(minutes=90)}] * 2

