"""What one rank's training run holds, passed to every phase of a step."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import Config
from pipeline.config.schema import SchedConfig
from pipeline.history.store import HistoryStore
from pipeline.loop.batches import PromptSource
from pipeline.loop.loggers import Loggers
from pipeline.loop.metrics import MetricsLog
from pipeline.loop.scheduled import ScheduledRollout
from pipeline.loop.tail_queue import TailQueue
from pipeline.loop.tp_groups import TPLayout
from pipeline.rollout.contract import RolloutBackend
from pipeline.sched.registry import RolloutPlacement
from pipeline.tasks.base import RewardFn
from pipeline.tasks.chat import PromptEncoder
from pipeline.tasks.prompts import Prompt
from pipeline.train.actor import Actor


@dataclass
class Context:
    """Everything one rank's run holds; rank 0 alone has history, metrics and evals."""

    cfg: Config
    rank: int
    world_size: int
    engine: RolloutBackend
    actor: Actor
    encoder: PromptEncoder  # prompt text -> input ids (chat template), response ids -> text
    prompts: PromptSource
    reward_fn: RewardFn
    run_dir: Path
    policy_version: int = 0
    start_step: int = 0
    history: HistoryStore | None = None
    # sched.policy resolved once for the run's rollout workers (setup); until then the
    # static split, which is what one worker resolves to
    placement: RolloutPlacement = field(
        default_factory=lambda: RolloutPlacement.from_config(SchedConfig(), workers=1))
    scheduler: ScheduledRollout | None = None  # when a coordinator places the batch (placement)
    metrics: MetricsLog | None = None
    evals: MetricsLog | None = None
    eval_set: list[Prompt] = field(default_factory=list)
    warmup_set: list[Prompt] = field(default_factory=list)  # the draft's (loop.warmup)
    summary: dict = field(default_factory=dict)
    loggers: Loggers | None = None  # rank 0: TensorBoard / W&B
    tp: TPLayout | None = None  # which ranks share one vLLM engine
    tail: TailQueue | None = None  # sched.tail_batching: what each step launches


__all__ = ["Context"]
