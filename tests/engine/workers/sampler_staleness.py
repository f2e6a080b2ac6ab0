"""Run by tests/engine/test_sampler_staleness.py: the Qwen2 stand-in in bf16 on both sides
(vLLM `model.dtype=bfloat16`, DeepSpeed bf16, ZeRO-3 on one rank), three GRPO steps with
vLLM's log-probs each step. After step 0 the trained weights are pushed into vLLM; after
step 1 they are not, so step 2 samples from the policy one step behind the trainer's.
Writes each checked step's sampler metrics as JSON."""

import json
import sys

import torch


def main(model: str, out: str, lr: str, stage: str) -> None:
    from pipeline import distributed as dist
    from pipeline.config import load_config
    from pipeline.config.schema import SpecConfig
    from pipeline.loop.rollouts import Rollout, to_batch
    from pipeline.rollout.contract import Sampling
    from pipeline.rollout.engine import RolloutEngine
    from pipeline.tasks.prompts import Prompt
    from pipeline.train.actor import Actor
    from test_drafting_greedy_identity import chat_prompts

    dist.init()
    cfg = load_config("sample_configs/qwen2-cpu.yaml", [
        f"model.path={model}", "model.dtype=bfloat16", "deepspeed.bf16=true",
        f"deepspeed.zero_stage={stage}", "deepspeed.torch_adam=true", "train.kl_coef=0",
        "train.gradient_checkpointing=false", "data.train_batch_size=4",
        "train.ppo_mini_batch_size=4", "rollout.n=8", "train.ppo_micro_batch_size=32",
        "rollout.max_tokens=64", f"train.lr={lr}", "spec.method=none"])
    engine = RolloutEngine.from_config(cfg, spec=SpecConfig(method="none"))
    actor = Actor.build(cfg, 1)
    prompts = chat_prompts(model)[:4]
    pad = 0
    results = []
    for step in range(3):
        sampling = Sampling(n=8, temperature=1.0, max_tokens=64, seed=step, logprobs=True)
        groups = engine.generate(prompts, sampling).groups
        rollouts = []
        for p, (ids, group) in enumerate(zip(prompts, groups)):
            prompt = Prompt(str(p), "", "")  # one object per group (`to_batch`'s key)
            for k, c in enumerate(group):
                rollouts.append(Rollout(prompt, ids, k, c,
                                        reward=float(sum(c.token_ids) % 5)))  # varied: most responses reach the cap
        metrics = actor.update(to_batch(rollouts, pad, "grpo"), keep_policy=True)
        before, after = actor._previous, actor._local_weights()
        changed = sum(int((a != b).sum()) for a, b in zip(before, after))
        results.append({"step": step, "weights_changed": changed,
                        **metrics})
        if step == 0:  # fresh: vLLM gets the trained weights
            engine.update_weights(actor.named_weights(), step + 1)
        # after step 1 nothing is pushed: step 2 samples from step 1's policy
    with open(out, "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[5])
    main(*sys.argv[1:5])
