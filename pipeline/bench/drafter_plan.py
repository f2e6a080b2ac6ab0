"""What one `rhymectl bench drafter` run measures (`Plan`): its shapes, passes and lanes, and
rhymectl's drafter settings (`spec.method: history+group` with the command's `spec.KEY=VALUE`
overrides, validated as a config's `spec` section). Every bad value is refused at once, in
one line. Measuring it: `pipeline.bench.drafter`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from pipeline.bench import drafter_workload as wl
from pipeline.config.schema import SpecConfig
from pipeline.errors import UsageError


@dataclass(frozen=True)
class Plan:
    """What one `bench drafter` run measures: one workload per --live value."""

    shapes: tuple[wl.Shape, ...]
    passes: int = 200
    repeats: int = 3
    k: int = 8
    start: int | None = None  # output tokens before the window [mean_len // 4]
    window: int = 10
    gpu_ms: float = 20.0
    inline: bool = False  # also measure rhymectl's drafter with its background work inline
    floor: bool = False  # also measure one bare tree query per row (`drafter_floor`)
    overrides: tuple[str, ...] = ()  # spec.KEY=VALUE settings of rhymectl's drafter
    spec: SpecConfig | None = None  # history+group with them (None: the defaults)
    # also time the draft model of a policy of this Hugging Face config (`drafter_model`),
    # for at most model_passes passes a repeat (None: passes)
    model_config: dict | None = None
    model_passes: int | None = None

    def spec_for(self, history_epochs: int) -> SpecConfig:
        """rhymectl's drafter settings on a workload of `history_epochs` epochs of history."""
        base = self.spec or SpecConfig(method="history+group", num_speculative_tokens=self.k)
        return replace(base, history_epochs=history_epochs)

    @property
    def lanes(self) -> tuple[str, ...]:
        return (("ours",) + (("ours-inline",) if self.inline else ()) + ("suffix",)
                + (("floor",) if self.floor else ())
                + (("model",) if self.model_config is not None else ()))

    def passes_of(self, lane: str) -> int:
        """Timed passes a repeat of `lane` runs."""
        if lane == "model" and self.model_passes is not None:
            return min(self.passes, self.model_passes)
        return self.passes

    @property
    def reach(self) -> int:
        """The most draft tokens a request gets in one pass, on any lane (rhymectl's
        drafter drafts more than k in thin passes, `pipeline.drafting.pass_caps`)."""
        from pipeline.rollout.speculation import engine_draft_tokens

        return max(self.k, engine_draft_tokens(self.spec_for(1)))

    def start_of(self, shape: wl.Shape) -> int:
        return shape.mean_len // 4 if self.start is None else self.start

    @property
    def total_passes(self) -> int:
        return sum(map(self.passes_of, self.lanes)) * self.repeats * len(self.shapes)


def make_plan(live: list[int], group: int, mean_len: int, vocab: int, rhyme: float,
              history_epochs: int, seed: int, passes: int, repeats: int, k: int = 8,
              start: int | None = None, window: int = 10, gpu_ms: float = 20.0,
              inline: bool = False, floor: bool = False, overrides: Sequence[str] = (),
              model: str | None = None, model_passes: int | None = None) -> Plan:
    """The plan, every bad value refused at once (UsageError naming each and its fix).
    model: a policy's config.json or directory (the model lane)."""
    errors = []
    spec = config = None
    try:
        spec = drafter_spec(overrides, k)
    except UsageError as e:
        errors.append(str(e))
    if model is not None:
        from pipeline.bench.drafter_model import read_policy_config
        from pipeline.rollout.draft_source import draft_device

        try:
            config = read_policy_config(model, vocab)
            draft_device((spec or SpecConfig()).draft_device)  # cuda where there is none
        except UsageError as e:
            errors.append(str(e))
    if model_passes is not None and (model is None or model_passes < 1):
        errors.append(f"--model-passes {model_passes}: give at least 1, with --model")
    if not live or any(n < 1 for n in live):
        errors.append("--live: give positive request counts, e.g. --live 512 or 128,512")
    elif any(n % group for n in live) if group >= 1 else False:
        errors.append(f"--live {','.join(map(str, live))}: each must be a multiple of "
                      f"--group {group} (live / group prompts run whole groups)")
    if group < 1:
        errors.append(f"--group {group}: need at least 1 response per prompt")
    if not 16 <= mean_len <= 16384:
        errors.append(f"--mean-len {mean_len}: give 16 .. 16384 tokens")
    if not 16 <= vocab <= 1 << 20:
        errors.append(f"--vocab {vocab}: give 16 .. 1048576 token ids")
    if not 0.0 <= rhyme <= 1.0:
        errors.append(f"--rhyme {rhyme}: give a rate in [0, 1]")
    if history_epochs < 1:
        errors.append(f"--history-epochs {history_epochs}: need at least 1")
    if passes < 1 or repeats < 1:
        errors.append(f"--passes {passes} / --repeats {repeats}: need at least 1 each")
    if k < 1:
        errors.append(f"--k {k}: need at least 1 draft token")
    if start is not None and not 0 <= start <= 4 * mean_len:
        errors.append(f"--start {start}: give 0 .. 4 x --mean-len output tokens")
    if window < 1 or gpu_ms < 0:
        errors.append(f"--window {window} / --gpu-ms {gpu_ms}: need window >= 1, gpu-ms >= 0")
    if errors:
        raise UsageError("; ".join(errors))
    shapes = tuple(wl.Shape(live=n, group=group, mean_len=mean_len, vocab=vocab, rhyme=rhyme,
                            history_epochs=history_epochs, seed=seed) for n in live)
    return Plan(shapes, passes, repeats, k, start, window, gpu_ms, inline, floor,
                tuple(overrides), spec, config, model_passes)


# what the bench's flags and workload set: the method it times, --k, --history-epochs
FIXED_KEYS = ("spec.method", "spec.num_speculative_tokens", "spec.history_epochs")


def drafter_spec(overrides: Sequence[str], k: int) -> SpecConfig | None:
    """`spec.method: history+group` with `k` draft tokens and the `spec.KEY=VALUE`
    overrides, validated as a config's `spec` section is (None: no overrides)."""
    if not overrides:
        return None
    from pipeline.config.load import ConfigError, load_config

    bad = [o for o in overrides if not o.startswith("spec.") or "=" not in o
           or o.split("=", 1)[0] in FIXED_KEYS]
    if bad:
        raise UsageError(f"{bad[0]}: give spec.KEY=VALUE settings of rhymectl's drafter (it "
                         "times spec.method history+group; --k and --history-epochs set "
                         "the draft cap and the history)")
    try:
        cfg = load_config(None, ["spec.method=history+group",
                                 f"spec.num_speculative_tokens={k}", *overrides])
    except ConfigError as e:
        raise UsageError("; ".join(e.problems)) from None
    return cfg.spec


__all__ = ["FIXED_KEYS", "Plan", "drafter_spec", "make_plan"]
