"""Every check that can fail on the user's input, run before any heavy work.

`rhymectl train --dry-run` stops after these; a real run does them first, so a bad config,
data set or model directory costs a second and writes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config import Config, ConfigError
from pipeline.config.methods import method
from pipeline.config.load import draft_model_problems
from pipeline.errors import UsageError
from pipeline.loop import loggers, rundir, tp_groups
from pipeline.loop.batches import PromptSource, warmup_batch
from pipeline.loop.memory import memory_problems
from pipeline.policy.checks import check_model_dir, fix_hint, model_config, model_context
from pipeline.rollout.versions import check_vllm
from pipeline.sched.registry import RolloutPlacement
from pipeline.tasks.chat import PromptEncoder
from pipeline.tasks.data import resolve_reward
from pipeline.tasks.math_rewards import REWARDS
from pipeline.tasks.prompts import eval_prompts, train_rows


def preflight(cfg: Config, world_size: int, local_world: int | None = None,
              device_gib: float | None = None) -> dict:
    """Run every check; raise one UsageError listing every problem found (checks that need
    a model directory or data set that failed are skipped); else return facts worth
    printing. `local_world`: ranks per node when the caller is about to start them itself
    (`train --nproc N`); else torchrun's LOCAL_WORLD_SIZE. `device_gib`: the GPU size the
    memory plan must fit (`--gpu-mem-gib`); None: the detected GPU, no check without one."""
    problems: list[str] = []

    def attempt(check, *args):
        try:
            return check(*args)
        except UsageError as exc:
            problems.append(str(exc))
            return None

    for problem in world_problems(cfg, world_size) + draft_model_problems(cfg):
        problems.append(problem)
    attempt(check_vllm, cfg.rollout.allow_untested_vllm)
    attempt(check_tp, cfg, world_size, local_world)
    attempt(loggers.check, cfg.run.loggers)
    attempt(rundir.check_writable, cfg.run.dir)
    model_dir = attempt(check_model_dir, cfg.model.path)
    dataset = attempt(train_rows, cfg.data)
    source = None if dataset is None else attempt(
        PromptSource, list(dataset), cfg.data.train_batch_size, cfg.data.seed, cfg.data.shuffle)
    reward_name = attempt(resolve_reward_name, cfg)
    if dataset is not None and reward_name is not None:
        attempt(check_references, reward_name, dataset, cfg.data.path or cfg.data.task)
    context = longest = None
    if model_dir is not None:
        context = attempt(model_context, model_dir)
        problems.extend(attempt(draft_shape_problems, cfg, model_dir) or [])
        if dataset is not None:
            longest = attempt(longest_prompt_tokens, model_dir, dataset["prompt"], cfg.data)
    warmup = attempt(warmup_batch, cfg, world_size) or []
    if cfg.spec.draft_warmup == "eval" and method(cfg.spec.method).model \
            and dataset is not None and not attempt(eval_prompts, cfg.data, set()):
        problems.append("spec.draft_warmup = eval learns from the held-out evaluation before "
                        "step 1, and this run has none (data.eval_path unset or "
                        "data.eval_size 0): give it one, or use spec.draft_warmup=rollout")
    if warmup and model_dir is not None:
        longest = max(longest or 0, attempt(longest_prompt_tokens, model_dir,
                                            [p.text for p in warmup], cfg.data) or 0)
    if longest is not None and longest > cfg.data.max_prompt_length:
        problems.append(f"the longest prompt has {longest} tokens, more than "
                        f"data.max_prompt_length = {cfg.data.max_prompt_length}; raise it or "
                        f"filter the data set")
    if context and cfg.data.max_prompt_length + cfg.rollout.max_tokens > context:
        problems.append(f"data.max_prompt_length + rollout.max_tokens = "
                        f"{cfg.data.max_prompt_length + cfg.rollout.max_tokens} exceeds the "
                        f"model's context of {context} tokens; lower rollout.max_tokens")
    problems.extend(memory_problems(cfg, world_size, device_gib))
    if problems:
        raise ConfigError(problems)
    return {"world_size": world_size, "prompts": len(source.prompts),
            "longest_prompt_tokens": longest,
            "model_context": context, "reward": reward_name}


def draft_shape_problems(cfg: Config, model_dir: Path) -> list[str]:
    """A method with a draft model whose `spec.draft_layers` layers of the policy's width
    do not fit in 10 % of the policy's parameters (`pipeline.draft_shape.shape_for`), said
    before an engine starts; nothing where its config.json does not give the policy's
    shape (vLLM then names what it lacks)."""
    from pipeline.draft_shape import DRAFT_FRACTION, policy_parameters, shape_for

    if not method(cfg.spec.method).model:
        return []
    config, layers = model_config(model_dir), cfg.spec.draft_layers

    def fits(n: int) -> bool:
        try:
            shape_for(config, layers=n)
        except ValueError:
            return False
        return True
    try:
        if fits(layers):
            return []
        width, params = int(config["hidden_size"]), policy_parameters(config)
    except (KeyError, TypeError, ValueError):
        return []
    most = next((n for n in range(layers - 1, 0, -1) if fits(n)), 0)
    fix = (f"lower spec.draft_layers to {most}" if most else
           "use a method without a draft model (history+group)")
    return [f"spec.draft_layers = {layers}: {layers} decoder layer(s) of the policy's width "
            f"({width}) do not fit in {DRAFT_FRACTION * 100:.0f} % of its {params:,} "
            f"parameters, the draft model's bound; {fix}"]


def world_problems(cfg: Config, world_size: int) -> list[str]:
    out = [f"{key} = {value} does not divide over {world_size} ranks; make it a multiple of "
           f"{world_size} or change --nproc"
           for key, value in (("data.train_batch_size", cfg.data.train_batch_size),
                              ("train.ppo_mini_batch_size", cfg.train.ppo_mini_batch_size))
           if value % world_size]
    workers = world_size // max(1, cfg.rollout.tensor_parallel_size)
    placement = None
    try:  # as setup resolves it on every rank
        placement = RolloutPlacement.from_config(cfg.sched, workers)
    except UsageError as exc:
        out.append(str(exc))
    if cfg.sched.tail_batching.overprovision > 0:
        if placement is not None and placement.coordinated:
            out.append(f"sched.tail_batching runs each rollout worker's own share (the static "
                       f"split); with {workers} workers set sched.policy: static, or "
                       f"sched.tail_batching.overprovision: 0 to keep sched.policy: "
                       f"{placement.name}")
        if cfg.rollout.tensor_parallel_size > 1:
            out.append("sched.tail_batching does not run with rollout.tensor_parallel_size > 1 "
                       "yet; set one of them back (overprovision: 0 or tensor_parallel_size: 1)")
    return out


def job_ranks(nproc: int, nnodes: int | None, dry_run: bool) -> tuple[int, int]:
    """(ranks in all, ranks per node) that the checks hold the config to: `--nproc N` ranks
    on this node, on each of `--nnodes M` nodes (a dry run on a login node for an M-node
    job); else the job's environment (torchrun's; for a dry run also Slurm's allocation,
    `pipeline.distributed.job_shape`); else this one process."""
    if nnodes is not None:
        if not dry_run:
            raise UsageError("--nnodes only describes a multi-node job to --dry-run; start the "
                             "job itself with one torchrun per node (sample_configs/slurm.sh)")
        return nnodes * nproc, nproc
    if nproc > 1:
        return nproc, nproc
    from pipeline.distributed import job_shape

    return job_shape(slurm=dry_run) or (1, 1)


def check_tp(cfg: Config, world_size: int, local_world: int | None = None) -> None:
    """The TP groups against the ranks and the ranks per node (`local_world`, else
    LOCAL_WORLD_SIZE under torchrun, else one node) and the batch: a group must not span
    nodes, so T must divide the GPUs per node."""
    local = local_world or int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    tp_groups.check(cfg.rollout.tensor_parallel_size, world_size, local,
                    cfg.data.train_batch_size, cfg.train.ppo_mini_batch_size)


def check_references(reward_name: str, dataset, source: str) -> None:
    """Every reference answer must be usable by a built-in math reward (gsm8k, math)."""
    if reward_name not in REWARDS:
        return
    _, usable, shape = REWARDS[reward_name]
    answers = dataset["answer"]
    bad = [i for i, a in enumerate(answers) if not usable(a)]
    if bad:
        raise UsageError(f"{len(bad)} of {len(answers)} answers of {source!r} are not usable by "
                         f"the {reward_name} reward (first at row {bad[0]}: "
                         f"{answers[bad[0]][:40]!r}); it needs {shape}: check data.answer_key")


def resolve_reward_name(cfg: Config) -> str:
    name = cfg.data.reward or cfg.data.task
    if name is None:
        raise UsageError("data.reward is not set; name a built-in reward (gsm8k, math), a "
                         "built-in task's reward (sort, reverse) or a module:function(prompt, "
                         "response, answer) -> float")
    resolve_reward(name)
    return name


def longest_prompt_tokens(model_dir: Path, prompts, data) -> int:
    """Tokens of the longest prompt as the policy will see it (after the chat template);
    a chat template that cannot be read or rendered is refused here."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:  # noqa: BLE001 — any loader failure is the directory's fault
        raise UsageError(f"the tokenizer in {model_dir} does not load ({type(exc).__name__}); "
                         f"{fix_hint(model_dir)}") from None
    encoder = PromptEncoder.from_config(data, tok)
    if encoder.format.template is None:  # one batched call (fast for large data sets)
        return max((len(ids) for ids in tok(list(prompts))["input_ids"]), default=0)
    return max((len(encoder.encode(p)) for p in prompts), default=0)
