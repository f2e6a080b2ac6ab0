"""Production-shaped response-length traces, generated from published statistics.

Seer (arXiv 2511.14617) reports long-reasoning RL rollouts with mean response lengths of
about 20-35k tokens, maxima of 64-98k (the generation limit) and 3-10k requests per
step. We model that as: each prompt has a difficulty d ~ LogNormal(0, prompt_sigma), its
group's lengths are LogNormal(log(mean_tokens * d) - s^2/2, s = sample_sigma), clipped to
[min_tokens, max_tokens]; a prompt keeps its difficulty across epochs, drifting by
LogNormal(0, drift_sigma) (RhymeRL: the length rank of a prompt barely moves between
epochs), so earlier epochs predict the last one as they would in training.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.sched.trace import Trace, TraceGroup


@dataclass(frozen=True)
class Shape:
    """A workload shape. mean_tokens is the mean before clipping at max_tokens."""

    prompts: int = 800
    n: int = 8
    epochs: int = 2
    mean_tokens: float = 25_000.0
    max_tokens: int = 65_536
    min_tokens: int = 64
    prompt_sigma: float = 0.6
    sample_sigma: float = 0.5
    drift_sigma: float = 0.15


def production_trace(shape: Shape = Shape(), seed: int = 0) -> Trace:
    """`shape.epochs` epochs of `shape.prompts` groups of `shape.n` lengths each."""
    rng = np.random.default_rng(seed)
    difficulty = rng.lognormal(-shape.prompt_sigma ** 2 / 2, shape.prompt_sigma, shape.prompts)
    groups = []
    for epoch in range(shape.epochs):
        if epoch:
            difficulty = difficulty * rng.lognormal(0.0, shape.drift_sigma, shape.prompts)
        mu = np.log(shape.mean_tokens * difficulty) - shape.sample_sigma ** 2 / 2
        lengths = rng.lognormal(mu[:, None], shape.sample_sigma, (shape.prompts, shape.n))
        lengths = np.clip(np.rint(lengths), shape.min_tokens, shape.max_tokens).astype(int)
        groups += [TraceGroup(f"q{p}", epoch, tuple(int(x) for x in lengths[p]))
                   for p in range(shape.prompts)]
    return Trace(f"synthetic(mean={shape.mean_tokens:.0f}, max={shape.max_tokens}, seed={seed})",
                 tuple(groups))


def write_csv(trace: Trace, path) -> None:
    """group,length,epoch rows (the `bench sched --trace` format)."""
    from pipeline.atomic import write_atomic

    def write(tmp):
        with open(tmp, "w") as fh:
            fh.write("group,length,epoch\n")
            for g in trace.groups:
                fh.writelines(f"{g.group_id},{x},{g.epoch}\n" for x in g.lengths)

    write_atomic(path, write)


__all__ = ["Shape", "production_trace", "write_csv"]
