"""Tensor-parallel rollout groups: which ranks share one vLLM engine.

With `rollout.tensor_parallel_size = T` the W ranks form G = W / T groups of T consecutive
ranks (ranks g*T .. g*T+T-1), the layout vLLM's `external_launcher` builds its own TP groups
with, so a group is one vLLM engine sharded over T ranks. Every rank of a group submits the
same requests and receives the same completions; the group generates the group's share of
the batch, and each rank then trains on its own 1/T of that share. Because shares are
contiguous, a rank's training share is exactly the one it has with T = 1:

    shard(shard(batch, g, G), t, T) == shard(batch, g*T + t, W)

Consecutive ranks keep a group on one node under torchrun (ranks are numbered node by node),
so TP traffic stays on the node's fast links; `check` refuses a T that would straddle nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import UsageError


@dataclass(frozen=True)
class TPLayout:
    """world: ranks in all; tp: ranks per group (T). Groups and ranks are 0-based."""

    world: int
    tp: int = 1

    @property
    def groups(self) -> int:
        return self.world // self.tp

    def group_of(self, rank: int) -> int:
        return rank // self.tp

    def tp_rank(self, rank: int) -> int:
        """The rank's position inside its group (0 = the group's leader)."""
        return rank % self.tp

    def leader(self, group: int) -> int:
        return group * self.tp

    def ranks(self, group: int) -> list[int]:
        return list(range(group * self.tp, (group + 1) * self.tp))

    def is_leader(self, rank: int) -> bool:
        return self.tp_rank(rank) == 0


def check(tp: int, world: int, local_world: int, batch: int, mini_batch: int) -> TPLayout:
    """The layout, or UsageError (one line) when T does not fit the ranks or the batch.

    local_world: ranks on one node (torchrun's LOCAL_WORLD_SIZE); batch / mini_batch: prompts
    per step and per optimiser step (data.train_batch_size, train.ppo_mini_batch_size).
    """
    key = "rollout.tensor_parallel_size"
    if world % tp:
        raise UsageError(f"{key} = {tp} does not divide the {world} ranks; use a divisor of "
                         f"{world} or change --nproc / the number of ranks")
    if local_world % tp:
        raise UsageError(f"{key} = {tp} does not divide the {local_world} ranks per node, so a "
                         f"TP group would span nodes; use a divisor of {local_world}")
    layout = TPLayout(world, tp)
    if tp > 1 and batch % layout.groups:  # with T = 1 the groups are the ranks: checked there
        raise UsageError(f"data.train_batch_size = {batch} does not divide over the "
                         f"{layout.groups} TP groups ({world} ranks / {key} = {tp}); make it a "
                         f"multiple of {layout.groups}")
    return layout


def new_groups(layout: TPLayout, timeout_min: float):
    """This rank's torch.distributed subgroup (every rank calls this, in the same order);
    None when T = 1. The rollout runtime broadcasts a group leader's decisions over it.
    `timeout_min` as the world group's: a subgroup does not inherit it (torch falls back to
    the backend's default, 10 minutes for NCCL)."""
    if layout.tp == 1:
        return None
    from datetime import timedelta

    import torch.distributed as dist

    mine = None
    for g in range(layout.groups):
        group = dist.new_group(layout.ranks(g), timeout=timedelta(minutes=timeout_min))
        if dist.get_rank() in layout.ranks(g):
            mine = group
    return mine
