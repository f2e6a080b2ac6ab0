"""The vLLM adapter: the only module that imports vLLM.

One in-process engine per rank (colocated with the trainer, as veRL's hybrid engine and
TRL's colocate mode do): `VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the engine core in this
process so weights can be pushed in place; under torchrun the `external_launcher` backend
lets every rank run its own engine (data-parallel rollout).
"""

from __future__ import annotations

import os
import time
from typing import Iterable, Sequence

import torch

from pipeline.config.methods import method
from pipeline.config.schema import Config, ModelConfig, RolloutConfig, SpecConfig
from pipeline.rollout import cpu_shm_name, runner_contract, speculation, versions
from pipeline.rollout.engine_args import (engine_model_len, sleep_mode_available,
                                          whole_prompt_prefill)
from pipeline.rollout.contract import Completion, RolloutResult, RolloutStats, Sampling
from pipeline.rollout.meter import PassCounts, PassMeter
from pipeline.rollout.request_id import RequestId
from pipeline.rollout.residency import Residency


def check_version(allow_untested: bool) -> None:
    """Once per process: refuse an untested vLLM (UsageError), or warn when allowed."""
    global _VERSION_CHECKED
    if _VERSION_CHECKED:
        return
    status = versions.check_vllm(allow_untested)
    if not status.ok:
        import sys
        print(f"warning: running on untested {status.distribution} {status.installed} "
              f"(rollout.allow_untested_vllm=true; tested: {status.supported})", file=sys.stderr)
    _VERSION_CHECKED = True


_VERSION_CHECKED = False


def _prepare_environment(rollout: RolloutConfig) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # The meter, the proposer and the weight sync need the V1 model runner; vLLM would pick
    # Model Runner V2 on a GPU with Triton (pipeline.rollout.runner_contract). Set before
    # vLLM reads its environment, and not overridable: V2 cannot run this adapter.
    os.environ[runner_contract.RUNNER_ENV] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(rollout.kv_cache_gib))))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # rhymectl reports what matters
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class RolloutEngine:
    """The vLLM engine behind the rollout contract (`pipeline.rollout.contract.RolloutBackend`)."""

    @classmethod
    def from_config(cls, cfg: Config, *, model: ModelConfig | None = None,
                    spec: SpecConfig | None = None) -> "RolloutEngine":
        """The engine a run of `cfg` uses: the one place an engine is built from a config
        (model, spec: instead of the config's own, e.g. a checkpoint or another method)."""
        model, spec = model or cfg.model, cfg.spec if spec is None else spec
        need = cfg.data.max_prompt_length + cfg.rollout.max_tokens
        return cls(model, cfg.rollout, engine_model_len(model.path, need, spec), cfg.run.seed,
                   spec)

    def __init__(self, model: ModelConfig, rollout: RolloutConfig, max_model_len: int, seed: int,
                 spec: SpecConfig | None = None):
        check_version(rollout.allow_untested_vllm)
        _prepare_environment(rollout)
        from vllm import LLM

        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        sleep_mode = sleep_mode_available()
        kwargs = dict(
            model=model.path,
            tokenizer=model.path,
            dtype=model.dtype,
            seed=seed,
            enforce_eager=rollout.enforce_eager,
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            max_model_len=max_model_len,
            max_num_seqs=rollout.max_num_seqs,
            tensor_parallel_size=rollout.tensor_parallel_size,
            trust_remote_code=model.trust_remote_code,
            disable_log_stats=False,  # per-request timestamps for the history store
            enable_sleep_mode=sleep_mode,  # free the GPU for the trainer between rollouts
        )
        if distributed:
            kwargs["distributed_executor_backend"] = "external_launcher"
            cpu_shm_name.apply()  # a killed job's segments must not stop this one
        if not torch.cuda.is_available():
            kwargs.update(whole_prompt_prefill(max_model_len))
        kwargs.update(speculation.llm_kwargs(spec))
        self._bind(LLM(**kwargs), spec, sleep_mode,
                   policy=speculation.PolicySource(model.path, seed, rollout.temperature))

    def _bind(self, llm, spec: SpecConfig | None, sleep_mode: bool,
              policy: "speculation.PolicySource | None" = None) -> None:
        """Wrap a built `vllm.LLM`: check its runner, meter its passes, attach the drafter."""
        self.llm = llm
        runner_contract.check(self.model_runner(), versions.installed_vllm().installed or "?")
        self.residency = Residency(llm, sleep_mode)
        self.loaded_version = 0
        self.drafting: speculation.Drafting | None = None
        if spec is not None and method(spec.method).drafter:
            self.drafting = speculation.Drafting(self.model_runner(), spec, policy=policy)
        self.speculating = spec is not None and spec.method != "none"
        self.meter = PassMeter(self.model_runner())
        if self.drafting is not None:
            self.meter.listener = self.drafting.on_pass

    # -- generation ---------------------------------------------------------------------
    def generate(self, prompts: Sequence[list[int]], sampling: Sampling) -> RolloutResult:
        """`sampling.n` responses per prompt (token-id prompts) → one list of completions per
        prompt, and what the rollout measured.

        Each response is its own request (the prompt repeated), so every response has its own
        id, timing, finish reason and seed (`RequestId.seed`), and greedy decoding (which vLLM
        restricts to n=1 under speculation) needs no special case.
        """
        from vllm.inputs import TokensPrompt

        self.residency.require_awake("generate")
        requests, params = [], []
        for p_idx, ids in enumerate(prompts):
            for k in range(sampling.n):
                requests.append(TokensPrompt(prompt_token_ids=list(ids)))
                params.append(_params(sampling, RequestId(p_idx, k).seed(sampling.seed,
                                                                         sampling.n)))
        started = self._begin(prompts, sampling.n)
        try:
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        finally:
            passes = self.meter.stop()
        groups: list[list[Completion]] = [[] for _ in prompts]
        for i, out in enumerate(outputs):
            groups[i // sampling.n].append(_completion(out, started))
        generated = sum(len(c.token_ids) for g in groups for c in g)
        return RolloutResult(groups, self._end(passes, generated, len(outputs)))

    def generate_first(self, prompts: Sequence[list[int]], sampling: Sampling, keep: int,
                       pinned: Sequence[bool] = ()) -> RolloutResult:
        """Tail batching: like `generate`, but stop as soon as `keep` groups are complete,
        the pinned ones among them whenever they finish, the others in the order they
        completed. Every other group is aborted and comes back as None, never partly
        (`RolloutStats.dropped_tokens`: tokens of their responses that had finished)."""
        n, must = sampling.n, [i for i, p in enumerate(pinned) if p][:keep]
        self.open_stream(prompts, n)
        got: list[dict[int, Completion]] = [{} for _ in prompts]
        done_order: list[int] = []  # complete groups, in the order they completed
        try:
            for p_idx, ids in enumerate(prompts):
                for k in range(n):
                    self.submit(RequestId(p_idx, k), ids, sampling)
            while self.busy() and not (len(done_order) >= keep
                                       and all(len(got[p]) == n for p in must)):
                for rid, completion in self.step():
                    got[rid.group][rid.sample] = completion
                    if len(got[rid.group]) == n:
                        done_order.append(rid.group)
            if self._stream_open:
                self.llm.llm_engine.abort_request(list(self._stream_open))
                self._stream_open.clear()
        finally:
            stats = self.close_stream()
        kept = set(must) | set([p for p in done_order if p not in must][:keep - len(must)])
        stats.dropped_tokens = sum(len(c.token_ids) for p, group in enumerate(got)
                                   if p not in kept for c in group.values())
        groups = [[got[p][k] for k in range(n)] if p in kept else None for p in range(len(prompts))]
        return RolloutResult(groups, stats)

    def _begin(self, prompts: Sequence[list[int]], n: int) -> float:
        """Announce the groups to the drafter and start counting passes; returns the start
        time on vLLM's engine-core clock (monotonic)."""
        if self.drafting:
            self.drafting.before(prompts, n)
        self.meter.start()
        return time.monotonic()

    def _end(self, passes: PassCounts, generated: int, requests: int) -> RolloutStats:
        """After the last pass: what the rollout measured (`requests` generated
        `generated` tokens in all)."""
        if self.drafting:
            self.drafting.after()
        return RolloutStats(passes, generated, requests, speculating=self.speculating)

    # -- streaming (requests added and finished one by one; see pipeline.loop.sched_runtime) ---
    def open_stream(self, prompts: Sequence[list[int]], n: int) -> None:
        """Start a rollout whose requests arrive through `submit` (the groups' prompts are
        announced to the drafter, as `generate` does)."""
        self.residency.require_awake("generate")
        self._stream_started = self._begin(prompts, n)
        self._stream_open: set[str] = set()  # ids (as vLLM was given them) not finished yet
        self._stream_output = [0, 0]

    def submit(self, request: RequestId, prompt_ids: Sequence[int], sampling: Sampling,
               prompt_len: int | None = None) -> None:
        """Queue one response (or chunk of one) of the stream's rollout; its completion
        comes back from `step` under `request`.

        sampling: the rollout's (`n`: its group size, `seed`: the step's); the request
        samples once, seeded by `request.seed`, at most `sampling.max_tokens` tokens.
        prompt_len: when the request continues a response, the length of the original
        prompt within `prompt_ids` (the rest is the output so far), for the drafter."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = _params(sampling, request.seed(sampling.seed, sampling.n),
                         output_kind=RequestOutputKind.FINAL_ONLY)
        key = str(request)
        if self.drafting and prompt_len is not None and prompt_len < len(prompt_ids):
            self.drafting.proposer.continues(key, prompt_len)
        self.llm.llm_engine.add_request(key, TokensPrompt(prompt_token_ids=list(prompt_ids)),
                                        params)
        self._stream_open.add(key)

    def busy(self) -> bool:
        return self.llm.llm_engine.has_unfinished_requests()

    def running(self) -> int:
        """Requests queued or running in the engine."""
        return self.llm.llm_engine.get_num_unfinished_requests()

    def step(self) -> list[tuple[RequestId, Completion]]:
        """One engine step (a target forward pass); the requests it finished (finished
        outputs carry the id vLLM was given, not its internal one)."""
        done = []
        for out in self.llm.llm_engine.step():
            if out.finished:
                c = _completion(out, self._stream_started)
                self._stream_output[0] += len(c.token_ids)
                self._stream_output[1] += 1
                self._stream_open.discard(out.request_id)
                done.append((RequestId.parse(out.request_id), c))
        return done

    def close_stream(self) -> RolloutStats:
        """End the stream's rollout; what it measured."""
        passes = self.meter.stop()
        generated, requests = self._stream_output
        return self._end(passes, generated, requests)

    # -- weights ------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load the policy of `version` (Hugging-Face-named tensors, streamed) and wake up.

        vLLM's sleep-mode order (`pipeline.rollout.residency`): wake the weights, load them,
        free the trainer's cached blocks, wake the KV cache, drop cached prefixes of the old
        weights. Also valid on an awake engine (a resume, a bench).

        vLLM's layer-wise reload restores a layer's old tensors when nothing was loaded into
        it. A tied `lm_head` is such a layer (the checkpoint has no lm_head.weight), and since
        it shares its tensor with `embed_tokens`, the restore silently undoes the new
        embedding. Tensors whose names map one-to-one onto vLLM parameters (embeddings,
        norms) are therefore copied again after the reload; fused ones (qkv, gate_up) are not
        affected.
        """
        self.residency.wake(["weights"])
        self._load(named_tensors)
        self.residency.loaded()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the gathered tensors and the trainer's cached blocks
        self.residency.wake(["kv_cache"])
        self.llm.reset_prefix_cache()
        self.loaded_version = version

    def _load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.residency.require_weights("load weights")
        runner = self.model_runner()
        tied = getattr(runner.get_model().config, "tie_word_embeddings", False)
        direct = {n: p.shape for n, p in runner.get_model().named_parameters()} if tied else {}
        stash: dict[str, torch.Tensor] = {}  # tied models only: the re-copy below

        def fits(name: str, tensor: torch.Tensor) -> bool:
            # vLLM pads vocabulary rows (to a multiple of 64): compare the other dims.
            shape = direct.get(name)
            return (shape is not None and len(shape) == tensor.dim()
                    and shape[1:] == tensor.shape[1:] and shape[0] >= tensor.shape[0])

        def tee():
            for name, tensor in named_tensors:
                if fits(name, tensor):
                    stash[name] = tensor
                yield name, tensor

        runner.reload_weights(weights_iterator=tee())
        if not tied:
            return
        model = runner.get_model()
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, tensor in stash.items():
                params[name].data[: tensor.shape[0]].copy_(tensor.to(params[name].dtype))
        lm_head = getattr(model, "lm_head", None)
        if lm_head is not None:
            # On CPU the lm_head GEMM runs on a packed copy made after loading: re-make it
            # from the (shared, now updated) embedding.
            lm_head.quant_method.process_weights_after_loading(lm_head)

    def warm_suffix_cache(self, pairs) -> int:
        """Feed (prompt ids, response ids) pairs to vLLM's `suffix` cache (see speculation)."""
        return speculation.warm_suffix_cache(self.model_runner(), pairs)

    def model_runner(self):
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner

    # -- memory -------------------------------------------------------------------------
    def sleep(self) -> None:
        """Give the accelerator memory to the trainer: vLLM's level-2 sleep (weights and KV
        cache discarded; `update_weights` wakes the engine with the next policy). The state
        is kept on CPU too, where vLLM has no sleep mode, so a wrong order fails there."""
        self.residency.sleep()


def _params(sampling: Sampling, seed: int | None, **extra):
    """vLLM sampling parameters of one response (n=1), with its logprobs if asked.

    No detokenization: callers decode the token ids they keep (once, in full), and vLLM
    would otherwise decode every response incrementally, token by token, in the engine's
    loop (and the text of every logprob token)."""
    from vllm import SamplingParams

    return SamplingParams(n=1, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                          max_tokens=sampling.max_tokens,
                          logprobs=0 if sampling.logprobs else None, seed=seed,
                          detokenize=False, **extra)


def _completion(out, started: float) -> Completion:
    c = out.outputs[0]
    logprobs = [lp[t].logprob for lp, t in zip(c.logprobs or [], c.token_ids)]
    stats = out.metrics
    gen = finish = 0.0
    last = getattr(stats, "last_token_ts", 0) if stats is not None else 0
    if last and getattr(stats, "scheduled_ts", 0):
        gen = max(0.0, last - stats.scheduled_ts)
    if last:
        finish = max(0.0, last - started)
    return Completion(request_id=out.request_id, token_ids=list(c.token_ids), logprobs=logprobs,
                      finish_reason=str(c.finish_reason or "length"), gen_seconds=gen,
                      finish_s=finish)
