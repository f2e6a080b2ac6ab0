"""The trainer half of the GPU path, checked in one short run on one GPU without vLLM.

    scripts/gpu_check.sh                       # a CUDA machine: a Qwen2.5-0.5B-shaped model
    scripts/gpu_check.sh --smoke               # anywhere (CPU too): a tiny model, same architecture
    scripts/gpu_check.sh --deepspeed-wheel DIR_OR_WHL

One process is one rank (a one-rank torch.distributed group, as `pipeline.distributed.init`
makes it). A Qwen2 model with random bf16 weights is written to a temporary directory;
`Actor.build` wraps it in DeepSpeed ZeRO-3 with the reference model (train.kl_coef > 0) and
gradient checkpointing; one GRPO update runs on synthetic rollouts; then the weights it
streams, a checkpoint with its Hugging-Face export, and the update's peak GPU memory against
the memory plan that `rhymectl train --dry-run` prints for the same config. vLLM takes no
part: the plan's vLLM items are left out of the comparison.

Output: one line per check on stdout, in order, `PASS|FAIL|SKIP <check>: <detail>`; the
per-phase figures and any traceback go to stderr. A check whose inputs failed is SKIP.
Exit status: 0 no check failed, 1 one did, 2 a bad command line.

DeepSpeed: imported when installed. Otherwise the wheels under --deepspeed-wheel (a .whl or
a folder of them; default wheels/) of DeepSpeed and of whichever of its requirements
(requirements/gpu-check.txt: what `import deepspeed` loads beyond torch) the machine lacks
are installed without their dependencies and without network (`pip install --no-deps
--no-index --target` a temporary folder put on sys.path); a wheel of a distribution the
machine has is not, so it cannot shadow the one its torch runs with. Every requirement that
is neither installed nor there as a wheel is named at once. The optimizer is torch's AdamW
(`deepspeed.torch_adam`, the default), so no CUDA op is compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GIB = 2 ** 30
WALL_LIMIT_S = 480.0  # the device budget of one check run: 8 minutes
MEMORY_TOLERANCE = 0.15  # |measured / planned - 1| at most
TESTED_DEEPSPEED = "0.19.8"  # requirements/base.txt
DEEPSPEED_NEEDS = ROOT / "requirements" / "gpu-check.txt"
WHEEL_COMMANDS = (f"pip wheel deepspeed=={TESTED_DEEPSPEED} --no-deps -w wheels/ and pip "
                  f"download --only-binary=:all: --no-deps -d wheels/ -r "
                  f"requirements/gpu-check.txt (docs/cluster.md, GPU check)")
# The trainer's items of the memory plan's train phase (the rest is vLLM's and the CUDA
# context's, which max_memory_allocated does not see or this run does not have).
TRAINER_ITEMS = ("policy weights", "gradients", "optimizer states", "reference model",
                 "activations", "logits", "ZeRO buffers")


@dataclass(frozen=True)
class Size:
    """The model (Qwen2Config keywords) and the rollouts of one run. The update trains on
    `prompts` x `n` sequences of at most `max_prompt` + `max_tokens` tokens, in micro-batches
    of `micro`: one optimizer step of len/micro accumulated micro-steps."""

    model: dict
    prompts: int
    n: int
    micro: int
    max_prompt: int
    max_tokens: int


QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  bos_token_id=151643, eos_token_id=151643)
FULL = Size(QWEN25_05B, prompts=2, n=4, micro=4, max_prompt=64, max_tokens=192)
SMOKE = Size(dict(QWEN25_05B, vocab_size=512, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, bos_token_id=0, eos_token_id=0),
             prompts=2, n=4, micro=4, max_prompt=16, max_tokens=24)


class Skip(Exception):
    """A check that does not apply to this run (its line says why)."""


class Failed(Exception):
    """A check that ran and found a problem (its line says which)."""


@dataclass
class Report:
    """The verdict lines, in order, and which checks passed."""

    passed: set[str] = field(default_factory=set)
    failed: list[str] = field(default_factory=list)
    out: object = field(default_factory=lambda: sys.stdout)  # libraries' prints go to stderr

    def run(self, name: str, check: Callable[[], str], needs: tuple[str, ...] = ()) -> None:
        """Run `check` (returns the PASS detail) unless a check it needs did not pass."""
        missing = [n for n in needs if n not in self.passed]
        if missing:
            return self.line("SKIP", name, f"needs {', '.join(missing)}")
        try:
            with contextlib.redirect_stdout(sys.stderr):
                detail = check()
        except Skip as exc:
            return self.line("SKIP", name, str(exc))
        except Failed as exc:
            self.failed.append(name)
            return self.line("FAIL", name, str(exc))
        except Exception as exc:  # noqa: BLE001 — any error is this check's verdict
            traceback.print_exc(file=sys.stderr)
            self.failed.append(name)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return self.line("FAIL", name, f"{type(exc).__name__}: {first}")
        self.passed.add(name)
        self.line("PASS", name, detail)

    def line(self, verdict: str, name: str, detail: str) -> None:
        print(f"{verdict} {name}: {detail}", file=self.out, flush=True)


def note(text: str) -> None:
    """A detail line for the reader of the log (stderr: stdout holds the verdicts)."""
    print(f"  {text}", file=sys.stderr, flush=True)


class Memory:
    """Peak allocated GPU memory per phase (torch.cuda.max_memory_allocated, reset at the
    start of each phase); nothing on a CPU run."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.peaks: dict[str, float] = {}  # GiB
        self.start: dict[str, float] = {}  # GiB allocated when the phase began

    @contextlib.contextmanager
    def phase(self, name: str):
        import torch

        if not self.cuda:
            yield
            return
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.start[name] = torch.cuda.memory_allocated() / GIB
        try:
            yield
        finally:
            torch.cuda.synchronize()
            self.peaks[name] = torch.cuda.max_memory_allocated() / GIB
            note(f"memory {name}: {self.start[name]:.2f} GiB allocated at the start, "
                 f"peak {self.peaks[name]:.2f} GiB")


@dataclass
class Run:
    args: argparse.Namespace
    size: Size
    tmp: Path
    memory: Memory | None = None
    cuda: bool = False
    cfg: object = None
    actor: object = None
    deepspeed_from: str = "installed"
    params: int = 0  # the model's, as torch counts them
    probe: str = ""  # the parameter compared before and after the update
    before: object = None  # its gathered value on the host
    guards: list = field(default_factory=list)


# -- environment ------------------------------------------------------------------------

def check_environment(run: Run) -> str:
    import torch
    import transformers

    run.cuda = torch.cuda.is_available()
    run.memory = Memory(run.cuda)
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    if not run.cuda:
        if not run.args.smoke:
            raise Failed(f"{versions}, no CUDA device visible; run on a GPU machine, or pass "
                         f"--smoke for the CPU run")
        return f"{versions}, no CUDA (CPU smoke run)"
    props = torch.cuda.get_device_properties(0)
    return (f"{versions}, CUDA {torch.version.cuda}, {props.name} "
            f"({props.total_memory / GIB:.0f} GiB)")


def wheels(path: Path) -> list[Path]:
    return sorted(path.glob("*.whl")) if path.is_dir() else [path] if path.is_file() else []


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them (a wheel's file name uses _)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_distribution(wheel: Path) -> str:
    return canonical(wheel.name.split("-")[0])


def is_installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def deepspeed_needs() -> list[str]:
    """DeepSpeed and what `import deepspeed` loads beyond torch: requirements/gpu-check.txt."""
    names = [line.split("#")[0].split("==")[0].strip()
             for line in DEEPSPEED_NEEDS.read_text().splitlines()]
    return ["deepspeed"] + [canonical(n) for n in names if n]


def lacking_wheels(found: list[Path], installed: Callable[[str], bool] = is_installed) -> list[str]:
    """The distributions DeepSpeed needs that neither the machine nor `found` has, sorted."""
    have = {wheel_distribution(p) for p in found}
    return sorted(n for n in deepspeed_needs() if n not in have and not installed(n))


def wheels_to_install(found: list[Path],
                      installed: Callable[[str], bool] = is_installed) -> list[Path]:
    """`found` less the wheels of distributions the machine has (numpy beside its torch):
    put first on sys.path, they would replace those. DeepSpeed's own always goes in."""
    return [p for p in found
            if wheel_distribution(p) == "deepspeed" or not installed(wheel_distribution(p))]


def install_wheels(found: list[Path], target: Path) -> None:
    """pip-install `found` into `target` with no dependencies and no index; on sys.path."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-index", "--disable-pip-version-check", "--target", str(target),
                           *map(str, found)], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
        raise Failed(f"pip could not install {', '.join(p.name for p in found)}: {lines[-1]}")
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()


def import_deepspeed(run: Run):
    """DeepSpeed as installed, else from the wheels."""
    try:
        return importlib.import_module("deepspeed")
    except ImportError as exc:
        missing = exc
    source = Path(run.args.deepspeed_wheel or ROOT / "wheels")
    found = wheels(source)
    if not found:
        raise Failed(f"DeepSpeed is not importable ({missing}) and {source} holds no wheel; on "
                     f"a machine with network: {WHEEL_COMMANDS}")
    folder = source if source.is_dir() else source.parent
    also = "" if source.is_dir() else f" and pass --deepspeed-wheel {folder}"
    lacking = lacking_wheels(found)
    if lacking:
        raise Failed(f"DeepSpeed needs {', '.join(lacking)}, which this machine lacks and "
                     f"{source} has no wheel of; put them in {folder}{also}: {WHEEL_COMMANDS}")
    chosen = wheels_to_install(found)
    install_wheels(chosen, run.tmp / "site")
    try:
        module = importlib.import_module("deepspeed")
    except ModuleNotFoundError as exc:
        raise Failed(f"DeepSpeed needs {exc.name!r}, which this machine lacks; put its wheel "
                     f"in {folder}{also} (docs/cluster.md, GPU check)") from None
    run.deepspeed_from = f"from {', '.join(p.name for p in chosen)}"
    return module


def check_deepspeed(run: Run) -> str:
    deepspeed = import_deepspeed(run)
    version = deepspeed.__version__
    pin = "" if version == TESTED_DEEPSPEED else f" (the project pins {TESTED_DEEPSPEED})"
    if run.cuda:
        ops = "optimizer torch AdamW (deepspeed.torch_adam): no CUDA op to build"
    elif run.deepspeed_from != "installed":
        # torch keeps one build per op name; this copy's sources differ from an installed
        # DeepSpeed's, so building into the shared cache would replace that build (and the
        # installed one would rebuild on its next use)
        os.environ["TORCH_EXTENSIONS_DIR"] = str(run.tmp / "torch_extensions")
        ops = "optimizer torch AdamW, CPU comm op compiled into a temporary folder (minutes)"
    else:
        from pipeline.train.ds_ops import comm_op_built

        if not comm_op_built():
            raise Failed("DeepSpeed's CPU comm op is not built (its first use compiles it for "
                         "minutes); run: python -m pipeline.train.ds_ops build")
        ops = "optimizer torch AdamW, CPU comm op built"
    return f"deepspeed {version}{pin} {run.deepspeed_from}; {ops}"


# -- the model and the config -----------------------------------------------------------

def check_model(run: Run) -> str:
    """A Qwen2 model with random weights in bf16, saved as safetensors, and the config."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from pipeline.config import load_config
    from pipeline.model_shape import ModelShape

    torch.manual_seed(0)
    path = run.tmp / "model"
    config = Qwen2Config(**run.size.model)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    params = sum(p.numel() for p in model.parameters())
    del model
    files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise Failed(f"save_pretrained wrote no safetensors file in {path}")
    run.params = params
    counted = ModelShape.from_config(json.loads((path / "config.json").read_text())).params
    s = run.size
    run.cfg = load_config(None, [
        f"model.path={path}", "model.dtype=bfloat16", f"run.dir={run.tmp / 'run'}",
        "deepspeed.zero_stage=3", "deepspeed.bf16=true", "deepspeed.torch_adam=true",
        "train.kl_coef=0.01", "train.gradient_checkpointing=true",
        f"data.train_batch_size={s.prompts}", f"train.ppo_mini_batch_size={s.prompts}",
        f"train.ppo_micro_batch_size={s.micro}", f"rollout.n={s.n}", "rollout.temperature=1.0",
        f"data.max_prompt_length={s.max_prompt}", f"rollout.max_tokens={s.max_tokens}"])
    return (f"Qwen2 of {params:,} parameters (the memory plan counts {counted:,}), "
            f"{config.num_hidden_layers} layers, vocab {config.vocab_size}, tied embeddings; "
            f"random bf16 weights in {', '.join(files)}; no tokenizer (the trainer reads ids)")


# -- the trainer ------------------------------------------------------------------------

def check_build(run: Run) -> str:
    from pipeline import distributed
    from pipeline.train.actor import Actor

    import torch.distributed as dist

    _, world = distributed.init(timeout_min=run.cfg.run.dist_timeout_min)
    if world != 1:
        raise Failed(f"this check runs one rank, not {world}; start it without torchrun")
    t0 = time.perf_counter()
    with run.memory.phase("build"):
        run.actor = Actor.build(run.cfg, world)
    actor = run.actor
    if actor.ref is None:
        raise Failed("train.kl_coef > 0 but Actor.build made no reference model")
    stage = actor.engine.zero_optimization_stage()
    if stage != 3:
        raise Failed(f"the policy's engine runs ZeRO-{stage}, not ZeRO-3")
    if not actor.engine.module.is_gradient_checkpointing:
        raise Failed("train.gradient_checkpointing is set but the policy does not checkpoint")
    ds = actor.ds_config
    return (f"ZeRO-3 on 1 rank ({dist.get_backend()}), device {actor.device}, policy + reference model, "
            f"gradient checkpointing; micro-batch {ds['train_micro_batch_size_per_gpu']} x "
            f"{ds['gradient_accumulation_steps']} accumulation steps; "
            f"{time.perf_counter() - t0:.1f} s")


@dataclass
class Group:
    """One prompt's rollouts: its ids, and per response the token ids, the sampler's
    log-prob of each token and the reward."""

    prompt: list[int]
    responses: list[list[int]]
    logprobs: list[list[float]]
    rewards: list[float]


def synthetic_groups(size: Size, seed: int = 1) -> list[Group]:
    """`size.prompts` groups of `size.n` responses of random ids, lengths, log-probs and
    rewards. Every group's first response runs to max_tokens and the first prompt is
    max_prompt long, so one micro-batch is as wide as the memory plan's sequences."""
    import torch

    gen, vocab = torch.Generator().manual_seed(seed), size.model["vocab_size"]

    def randint(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    groups = []
    for g in range(size.prompts):
        plen = size.max_prompt if g == 0 else randint(size.max_prompt // 2, size.max_prompt)
        lens = [size.max_tokens] + [randint(1, size.max_tokens) for _ in range(size.n - 1)]
        groups.append(Group(
            torch.randint(0, vocab, (plen,), generator=gen).tolist(),
            [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lens],
            [(-5 * torch.rand(n, generator=gen)).tolist() for n in lens],
            torch.rand(size.n, generator=gen).tolist()))
    return groups


def to_batch(groups: list[Group], pad_id: int, adv_estimator: str):
    """The `Batch` that `pipeline.loop.rollouts.to_batch` builds from these rollouts (that
    module needs the data stack, which a bare GPU machine lacks; tests/unit compares the
    two): prompt + response right-padded to [N, T], the sampler's log-probs [N, T-1] in
    the columns that score response tokens, group-normalised advantages [N]."""
    import torch

    from pipeline.train import grpo
    from pipeline.train.batch import Batch

    rows = [(g, k, group) for g, group in enumerate(groups) for k in range(len(group.responses))]
    seqs = [group.prompt + group.responses[k] for _, k, group in rows]
    width = max(len(q) for q in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    sampler = torch.zeros((len(seqs), width - 1))
    for i, (q, (_, k, group)) in enumerate(zip(seqs, rows)):
        ids[i, : len(q)] = torch.tensor(q)
        start = len(group.prompt) - 1  # column j scores token j+1
        sampler[i, start: start + len(group.logprobs[k])] = torch.tensor(group.logprobs[k])
    rewards = [group.rewards[k] for _, k, group in rows]
    adv = grpo.get_advantage_estimator(adv_estimator)(rewards, [g for g, _, _ in rows])
    return Batch(ids, torch.tensor([len(group.prompt) for _, _, group in rows]),
                 torch.tensor([len(q) for q in seqs]), adv.float(), sampler)


class DeviceGuard:
    """Forward pre-hook: every tensor argument must be on `device` (the engine's)."""

    def __init__(self, module, name: str, device):
        self.name, self.device, self.calls, self.problems = name, device, 0, []
        self.handle = module.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        import torch

        self.calls += 1
        for key, value in [*enumerate(args), *kwargs.items()]:
            if isinstance(value, torch.Tensor) and value.device != self.device:
                self.problems.append(f"{self.name} forward got {key} on {value.device}")


def gathered(actor, name: str):
    """One full parameter, gathered, on the host (every parameter is iterated: every rank
    takes part in every gather)."""
    found = None
    for n, tensor in actor.named_weights():
        if n == name:
            found = tensor.to("cpu", copy=True)
    if found is None:
        raise Failed(f"named_weights() yields no {name}")
    return found


def check_update(run: Run) -> str:
    actor, layers = run.actor, run.size.model["num_hidden_layers"]
    run.probe = f"model.layers.{layers // 2}.mlp.down_proj.weight"
    run.before = gathered(actor, run.probe)
    run.guards = [DeviceGuard(actor.engine.module, "policy", actor.device),
                  DeviceGuard(actor.ref.module, "reference", actor.device)]
    batch = to_batch(synthetic_groups(run.size), run.size.model["eos_token_id"],
                     run.cfg.train.adv_estimator)
    t0 = time.perf_counter()
    try:
        with run.memory.phase("update"):
            metrics = actor.update(batch)
    finally:
        for guard in run.guards:
            guard.handle.remove()
    seconds = time.perf_counter() - t0
    after = gathered(actor, run.probe)
    bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
    if bad or "loss" not in metrics:
        raise Failed(f"metrics not finite or no loss: {metrics}")
    changed = (after != run.before).float().mean().item()
    if changed == 0:
        raise Failed(f"loss {metrics['loss']:.4g} but {run.probe} did not change")
    delta = (after.float() - run.before.float()).abs().max().item()
    tokens = int((batch.total_lens - batch.prompt_lens).sum())
    note("update metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
    return (f"{batch.size} sequences, {tokens} response tokens, width {batch.input_ids.shape[1]}; "
            f"loss {metrics['loss']:.4g} (finite), kl {metrics.get('kl', float('nan')):.3g}; "
            f"{run.probe} changed in {changed:.0%} of its elements (max |delta| {delta:.2e}); "
            f"{seconds:.1f} s")


def partition_devices(module) -> set:
    """Devices holding the module's parameters (their ZeRO-3 partitions where partitioned)."""
    return {str(getattr(p, "ds_tensor", p).device) for p in module.parameters()}


def check_devices(run: Run) -> str:
    actor = run.actor
    problems = [p for g in run.guards for p in g.problems]
    if problems:
        raise Failed(f"{len(problems)} forward inputs off {actor.device}: {problems[0]}")
    calls = {g.name: g.calls for g in run.guards}
    if not all(calls.values()):
        raise Failed(f"a model never ran in the update (forward calls: {calls})")
    where = {name: partition_devices(engine.module)
             for name, engine in (("policy", actor.engine), ("reference", actor.ref))}
    expected = {str(actor.device)}
    off = {name: sorted(devices) for name, devices in where.items() if devices != expected}
    if off:
        raise Failed(f"parameters not (only) on {actor.device}: {off}")
    return (f"{calls['policy']} policy and {calls['reference']} reference forwards, every "
            f"input on {actor.device}; both models' parameters (ZeRO-3 partitions) on "
            f"{actor.device}")


def check_named_weights(run: Run) -> str:
    import torch

    actor = run.actor
    expected = torch.bfloat16 if run.cfg.deepspeed.bf16 else torch.float32
    count, numel, wrong = 0, 0, []
    with run.memory.phase("named_weights"):
        for name, tensor in actor.named_weights():
            count += 1
            numel += tensor.numel()
            if tensor.dtype != expected or tensor.device != actor.device:
                wrong.append(f"{name} {tensor.dtype} on {tensor.device}")
    if wrong:
        raise Failed(f"{len(wrong)} of {count} not {expected} on {actor.device}: {wrong[0]}")
    return f"{count} tensors ({numel:,} elements), all {expected} on {actor.device}"


def check_checkpoint(run: Run) -> str:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    actor, ckpt, hf = run.actor, run.tmp / "ckpt", run.tmp / "hf"
    t0 = time.perf_counter()
    with run.memory.phase("save"):
        actor.save(ckpt, hf)
    seconds = time.perf_counter() - t0
    if not (ckpt / "ds").is_dir():
        raise Failed(f"no DeepSpeed state under {ckpt / 'ds'}")
    files = sorted(hf.glob("*.safetensors"))
    dtypes, stored = set(), 0
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                dtypes.add(f.get_slice(key).get_dtype())
                stored += 1
    if dtypes != {"BF16"}:
        raise Failed(f"the export holds {sorted(dtypes) or 'nothing'}, not BF16 only")
    config_dtype = json.loads((hf / "config.json").read_text()).get("dtype")
    if config_dtype != "bfloat16":
        raise Failed(f"the export's config.json says dtype {config_dtype}, not bfloat16")
    model, info = AutoModelForCausalLM.from_pretrained(hf, dtype="auto", output_loading_info=True)
    lost = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys",
                                                         "mismatched_keys")}
    if lost:
        raise Failed(f"transformers reloads the export with {lost}")
    state = model.state_dict()
    unequal = [name for name, tensor in actor.named_weights()
               if not torch.equal(tensor.cpu(), state[name])]
    if unequal:
        raise Failed(f"{len(unequal)} reloaded tensors differ from the trainer's, e.g. {unequal[0]}")
    if model.dtype != torch.bfloat16:
        raise Failed(f"transformers reloads the export as {model.dtype}")
    size = sum(f.stat().st_size for f in files) / 1e9
    return (f"DeepSpeed state + export of {stored} tensors in {len(files)} file(s), "
            f"{size:.2f} GB, BF16; transformers reloads it as bfloat16 with every tensor equal "
            f"to the trainer's; {seconds:.1f} s")


# -- memory against the plan ------------------------------------------------------------

def check_memory(run: Run) -> str:
    if not run.cuda:
        raise Skip("no CUDA device: max_memory_allocated measures GPU memory only")
    from pipeline.loop.memory import plan_for

    plan = plan_for(run.cfg, 1)
    if plan.params != run.params:
        raise Failed(f"the plan counts {plan.params:,} parameters, the model has {run.params:,}")
    items = {i.name: i.train for i in plan.items if i.name in TRAINER_ITEMS}
    planned = sum(items.values())
    measured = run.memory.peaks["update"]
    for name, gib in items.items():
        note(f"plan train phase: {name} {gib:.3f} GiB")
    if plan.deepspeed is not None:
        note(f"plan: model states {plan.model_states_gib:.2f} GiB; {plan.deepspeed[1]}: "
             f"{plan.deepspeed[0]:.2f} GiB")
    note("peaks by phase: " + ", ".join(f"{k} {v:.2f} GiB" for k, v in run.memory.peaks.items()))
    off = measured / planned - 1
    detail = (f"update peak {measured:.2f} GiB (max_memory_allocated; "
              f"{run.memory.start['update']:.2f} GiB held before it), plan {planned:.2f} GiB "
              f"(train phase, trainer items; micro-batch {plan.micro_batch} x {plan.seq_len} "
              f"tokens); {off:+.1%}")
    if abs(off) > MEMORY_TOLERANCE:
        raise Failed(f"{detail}, beyond {MEMORY_TOLERANCE:.0%}")
    return detail


def check_wall(run: Run, started: float) -> str:
    seconds = time.perf_counter() - started
    if run.args.smoke:
        raise Skip(f"{seconds:.0f} s; the {WALL_LIMIT_S:.0f} s budget is the full run's on a GPU")
    if seconds > WALL_LIMIT_S:
        raise Failed(f"{seconds:.0f} s, over the {WALL_LIMIT_S:.0f} s budget")
    return f"{seconds:.0f} s in all (budget {WALL_LIMIT_S:.0f} s)"


# -- the run ----------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.sh", description=(
        "Check the trainer half of the GPU path (DeepSpeed ZeRO-3, one GPU, no vLLM)."))
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny model; runs without CUDA (the memory check is then SKIP)")
    parser.add_argument("--deepspeed-wheel", metavar="PATH",
                        help="a DeepSpeed wheel, or a folder of wheels (DeepSpeed and the "
                             "dependencies this machine lacks), installed when DeepSpeed is "
                             "not importable (default: wheels/)")
    args = parser.parse_args(argv)
    if args.deepspeed_wheel and not Path(args.deepspeed_wheel).exists():
        parser.error(f"--deepspeed-wheel {args.deepspeed_wheel} does not exist; give a .whl "
                     f"file or a folder of them")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="rhymectl-gpu-check-") as tmp:
        run = Run(args, SMOKE if args.smoke else FULL, Path(tmp))
        report.run("environment", lambda: check_environment(run))
        report.run("deepspeed", lambda: check_deepspeed(run), needs=("environment",))
        report.run("model", lambda: check_model(run), needs=("environment",))
        report.run("build", lambda: check_build(run), needs=("deepspeed", "model"))
        report.run("update", lambda: check_update(run), needs=("build",))
        report.run("devices", lambda: check_devices(run), needs=("update",))
        report.run("named_weights", lambda: check_named_weights(run), needs=("build",))
        report.run("checkpoint", lambda: check_checkpoint(run), needs=("build",))
        report.run("memory", lambda: check_memory(run), needs=("update",))
        report.run("wall_time", lambda: check_wall(run, started))
        close(run)
    return 1 if report.failed else 0


def close(run: Run) -> None:
    """Tear the process group down so that the process exits cleanly."""
    import torch.distributed as dist

    run.actor = None
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
