"""Every check that can fail on the user's input, run before any heavy work.

`rhymectl train --dry-run` stops after these; a real run does them first, so a bad config,
data set or model directory costs a second and writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config import Config
from pipeline.errors import UsageError
from pipeline.policy.checks import check_model_dir
from pipeline.tasks.data import resolve_reward
from pipeline.tasks.prompts import train_rows


def preflight(cfg: Config, world_size: int) -> dict:
    """Raise UsageError on the first blocking problem; return facts worth printing."""
    check_world(cfg, world_size)
    model_dir = check_model_dir(cfg.model.path)
    dataset = train_rows(cfg.data)
    reward_name = resolve_reward_name(cfg)
    context = model_context(model_dir)
    longest = longest_prompt_tokens(model_dir, dataset["prompt"])
    if longest > cfg.data.max_prompt_length:
        raise UsageError(f"the longest prompt has {longest} tokens, more than "
                         f"data.max_prompt_length = {cfg.data.max_prompt_length}; raise it or "
                         f"filter the data set")
    if context and cfg.data.max_prompt_length + cfg.rollout.max_tokens > context:
        raise UsageError(f"data.max_prompt_length + rollout.max_tokens = "
                         f"{cfg.data.max_prompt_length + cfg.rollout.max_tokens} exceeds the "
                         f"model's context of {context} tokens; lower rollout.max_tokens")
    return {"world_size": world_size, "prompts": len(dataset), "longest_prompt_tokens": longest,
            "model_context": context, "reward": reward_name}


def check_world(cfg: Config, world_size: int) -> None:
    for key, value in (("data.train_batch_size", cfg.data.train_batch_size),
                       ("train.ppo_mini_batch_size", cfg.train.ppo_mini_batch_size)):
        if value % world_size:
            raise UsageError(f"{key} = {value} does not divide over {world_size} ranks; make it a "
                             f"multiple of {world_size} or change --nproc")


def resolve_reward_name(cfg: Config) -> str:
    name = cfg.data.reward or cfg.data.task
    if name is None:
        raise UsageError("data.reward is not set; name a built-in task's reward (sort, reverse) "
                         "or a module:function(prompt, response, answer) -> float")
    resolve_reward(name)
    return name


def model_context(model_dir: Path) -> int | None:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{model_dir}/config.json cannot be read ({exc}); rebuild the model "
                         f"directory") from None
    return config.get("max_position_embeddings")


def longest_prompt_tokens(model_dir: Path, prompts) -> int:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:  # noqa: BLE001 — any loader failure is the directory's fault
        raise UsageError(f"the tokenizer in {model_dir} does not load ({type(exc).__name__}); "
                         f"rebuild it with `rhymectl init-model --out {model_dir} --force`") from None
    return max((len(ids) for ids in tok(list(prompts))["input_ids"]), default=0)
