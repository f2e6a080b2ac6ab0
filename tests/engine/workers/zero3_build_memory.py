"""Run under torchrun (2 ranks) by tests/engine/test_zero3_build_memory.py: `Actor.build`
under ZeRO-3 in bf16 (from an fp32 checkpoint) with a reference model, while a thread samples this process's resident
memory. Each rank writes, as JSON: the peak anonymous resident memory (what a job's memory
limit cannot reclaim; the checkpoint's memory-mapped pages are page cache) above what the
process held before, while each `from_pretrained` ran and over the whole build, and
whether every weight of the policy and the reference model, gathered, equals the
checkpoint's."""

import json
import re
import sys
import threading
import time

import torch


class Peak:
    """The highest RssAnon (bytes) seen since `reset`, sampled every millisecond."""

    def __init__(self):
        self.value = self.overall = self.now()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> int:
        with open("/proc/self/status") as fh:
            return int(re.search(r"RssAnon:\s+(\d+) kB", fh.read()).group(1)) * 1024

    def reset(self) -> int:
        self.value = self.now()
        return self.value

    def _run(self):
        while not self._stop:
            now = self.now()
            self.value, self.overall = max(self.value, now), max(self.overall, now)
            time.sleep(0.001)

    def stop(self) -> int:
        """The highest value since the thread started."""
        self._stop = True
        self._thread.join()
        return max(self.overall, self.now())


def main(model: str, out: str) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from pipeline import distributed as dist
    from pipeline.config import load_config
    from pipeline.train.actor import Actor

    rank, world = dist.init()
    cfg = load_config(None, [f"model.path={model}", "deepspeed.zero_stage=3", "deepspeed.bf16=true",
                             "deepspeed.torch_adam=true", "train.kl_coef=0.01",
                             "data.train_batch_size=2", "train.ppo_mini_batch_size=2",
                             "rollout.n=2", "train.ppo_micro_batch_size=2"])
    peak, loads = Peak(), []
    load = AutoModelForCausalLM.from_pretrained.__func__

    def measured(klass, *args, **kwargs):
        before = peak.reset()
        try:
            return load(klass, *args, **kwargs)
        finally:
            loads.append(max(peak.value, peak.now()) - before)

    AutoModelForCausalLM.from_pretrained = classmethod(measured)
    dist.barrier()
    peak.overall = base = peak.reset()
    actor = Actor.build(cfg, world)
    high = peak.stop() - base
    AutoModelForCausalLM.from_pretrained = classmethod(load)

    import deepspeed
    want = load_file(f"{model}/model.safetensors")
    same = {"policy": True, "reference": True}
    for name, module in (("policy", actor.engine.module), ("reference", actor.ref.module)):
        for key, param in module.named_parameters():
            with deepspeed.zero.GatheredParameters([param]):
                same[name] &= bool(torch.equal(param.data, want[key].to(param.dtype)))
    result = {"rank": rank, "world": world, "loads": loads, "build": high,
              "same": same, "reference_stage": actor.ref.zero_optimization_stage()}
    with open(f"{out}.{rank}", "w") as fh:
        json.dump(result, fh)
    dist.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
