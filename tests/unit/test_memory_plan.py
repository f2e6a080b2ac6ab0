"""The per-GPU memory plan: parameter counts from config.json (checked against the model built
on the meta device), ZeRO's partitioning rules, DeepSpeed's own estimator, the sample 7B
config on 8 x 80 GiB, and `rhymectl train --dry-run`'s table, JSON and refusal (one line,
exit 2). No GPU: the device size is `--gpu-mem-gib` or a stubbed detection."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from pipeline.config import load_config
from pipeline.memory_plan import (CONTEXT_GIB, CUDA_GRAPHS_GIB, GIB, LOGPROB_CHUNK_GIB,
                                  REDUCE_BUCKET, build_plan)
from pipeline.model_shape import ModelShape, PlanUnavailable
from pipeline.train.ds_estimate import model_states_gib
from rhymectl.app import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "sample_configs" / "tiny.yaml")
GPU_7B = ROOT / "sample_configs" / "gpu-7b.yaml"
QWEN_7B = Path(__file__).resolve().parent / "data" / "qwen2.5-7b" / "config.json"
QWEN_7B_PARAMS = 7_615_616_512  # 2 x 152064 x 3584 + 28 x 233,057,792 + 3584 (final norm)
SMALL = dict(model_type="llama", vocab_size=1000, hidden_size=64, intermediate_size=96,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def qwen7b() -> ModelShape:
    return ModelShape.from_config(json.loads(QWEN_7B.read_text()))


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """An empty folder, no torchrun environment, and no GPU whatever the machine has."""
    monkeypatch.setenv("RHYMECTL_DEBUG", "0")
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("pipeline.loop.memory.detected_device", lambda: None)
    monkeypatch.chdir(tmp_path)


# -- the model's shape -------------------------------------------------------------------


def test_qwen25_7b_has_its_published_parameter_count():
    shape = qwen7b()
    assert shape.params == QWEN_7B_PARAMS
    assert abs(shape.params / 7.62e9 - 1) < 0.005
    assert shape.largest_layer == 152064 * 3584  # the embedding (and the untied lm_head)


@pytest.mark.parametrize("config", [
    json.loads(QWEN_7B.read_text()),
    {**SMALL, "tie_word_embeddings": True, "num_key_value_heads": 4, "head_dim": 16},
    {**SMALL, "attention_bias": True, "mlp_bias": True},
    {**SMALL, "model_type": "qwen3", "head_dim": 32, "tie_word_embeddings": True},
    {**SMALL, "model_type": "mistral", "num_key_value_heads": 1, "head_dim": 8},
], ids=["qwen2.5-7b", "llama-tied", "llama-biases", "qwen3", "mistral"])
def test_counts_equal_the_model_built_on_the_meta_device(config):
    """transformers builds the architecture without weights; its distinct parameters and its
    largest module's own parameters (what DeepSpeed's model_to_params counts) are ours."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    shape = ModelShape.from_config(config)
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert shape.largest_layer == max(sum(p.numel() for p in m.parameters(recurse=False))
                                      for m in model.modules())


@pytest.mark.parametrize("config, reason", [
    ({**SMALL, "hidden_size": None}, "config.json has no hidden_size"),
    ({k: v for k, v in SMALL.items() if k != "vocab_size"}, "config.json has no vocab_size"),
    ({**SMALL, "num_local_experts": 8}, "config.json describes a mixture-of-experts model"),
])
def test_a_config_the_plan_cannot_count(config, reason):
    with pytest.raises(PlanUnavailable, match=f"^{reason}$"):
        ModelShape.from_config(config)


def test_a_model_type_outside_the_llama_family_is_counted_with_a_note():
    plan = build_plan(ModelShape.from_config({**SMALL, "model_type": "phi3"}),
                      load_config(TINY), 1, None)
    assert plan.notes == ("model_type phi3 is counted as a dense Llama-style decoder",)


# -- the plan's arithmetic ---------------------------------------------------------------


def items(plan) -> dict:
    return {i.name: (i.rollout, i.train) for i in plan.items}


def test_zero_stages_partition_optimizer_then_gradients_then_weights():
    shape, n = qwen7b(), 8
    p = shape.params / GIB  # GiB per byte-per-parameter
    got = {s: items(build_plan(shape, load_config(TINY, [f"deepspeed.zero_stage={s}",
                                                         "deepspeed.bf16=true"]), n, 80.0))
           for s in range(4)}
    full, part = 2 * p, 2 * p / n
    assert [got[s]["policy weights"] for s in range(4)] == [(full, full)] * 3 + [(part, part)]
    # train phase: full for ZeRO-0/1, partitioned from 2; between steps only ZeRO-3's buffer
    assert [got[s]["gradients"] for s in range(4)] == [
        (0.0, full), (0.0, full), (0.0, part), (part, part)]
    # 12 B/param held (fp32 master + Adam m, v); + 4 B/param fp32 gradients at the step
    assert got[0]["optimizer states"] == (12 * p, 16 * p)
    assert [got[s]["optimizer states"] for s in (1, 2, 3)] == [(12 * p / n, 16 * p / n)] * 3
    assert got[0].get("ZeRO buffers") is None
    bucket = 2 * REDUCE_BUCKET / GIB
    assert got[1]["ZeRO buffers"] == got[2]["ZeRO buffers"] == (0.0, bucket)
    gathered = (4 * shape.largest_layer + 2 * 50_000_000) / GIB  # weight + gradient, prefetch
    assert got[3]["ZeRO buffers"] == (bucket, pytest.approx(bucket + gathered))


def test_fp32_training_has_no_master_copy_at_zero_0():
    p = qwen7b().params / GIB
    plan = build_plan(qwen7b(), load_config(TINY, ["deepspeed.zero_stage=0"]), 1, 80.0)
    assert items(plan)["policy weights"] == (4 * p, 4 * p)
    assert items(plan)["optimizer states"] == (8 * p, 8 * p)  # Adam's moments only


def test_activations_and_logits_by_hand():
    """hidden 64, 4 heads x 16, intermediate 96, 2 layers, vocab 1000; 2 sequences x
    (32 + 16) tokens in bf16. Per token and layer: norms 2 x (4 + 2) x 64 = 768, attention
    2 x (5 x 64 + 48) = 736, MLP 2 x 4 x 96 = 768: 2272 bytes; final norm 6 x 64 = 384."""
    shape = ModelShape.from_config(SMALL)
    cfg = load_config(TINY, ["deepspeed.bf16=true", "data.max_prompt_length=32",
                             "rollout.max_tokens=16", "train.ppo_micro_batch_size=2"])
    assert shape.layer_activation_bytes(48, 2) == 2272
    tokens = 2 * 48
    plain = items(build_plan(shape, cfg, 1, None))
    assert plain["activations"] == (0.0, tokens * (2 * 2272 + 384) / GIB)
    # logits and their gradient in bf16, two fp32 chunks of 256 MiB
    assert plain["logits"] == (0.0, 2 * 2 * tokens * 1000 / GIB + 0.5)
    checkpointed = build_plan(shape, replace(cfg, train=replace(
        cfg.train, gradient_checkpointing=True)), 1, None)
    assert items(checkpointed)["activations"] == (0.0, tokens * (2 * 2 * 64 + 2272 + 384) / GIB)


def test_micro_batch_is_at_most_a_ranks_share_of_a_mini_batch():
    cfg = load_config(GPU_7B)  # 64 prompts per mini-batch / 8 ranks x 8 responses = 64
    assert build_plan(qwen7b(), cfg, 8, None).micro_batch == 8  # train.ppo_micro_batch_size
    assert build_plan(qwen7b(), cfg, 64, None).micro_batch == 8
    small = load_config(GPU_7B, ["train.ppo_mini_batch_size=8", "rollout.n=4"])
    assert build_plan(qwen7b(), small, 8, None).micro_batch == 4  # 1 prompt x 4 responses


def test_the_plan_sizes_what_the_trainer_runs():
    """The micro-batch the actor configures DeepSpeed with, and the log-probs' fp32 chunk."""
    from pipeline.train.ds_config import deepspeed_config
    from pipeline.train.logprobs import CHUNK_BYTES

    # (overrides, the actor's micro-batch, the plan's): 64 sequences per rank and mini-batch
    # split by 8, or (a cap of 5) by the largest divisor 4, which the plan bounds by 5
    for overrides, actor, plan in (([], 8, 8), (["train.ppo_micro_batch_size=5"], 4, 5),
                                   (["train.ppo_mini_batch_size=8", "rollout.n=4"], 4, 4)):
        cfg = load_config(GPU_7B, overrides)
        assert deepspeed_config(cfg, 8)["train_micro_batch_size_per_gpu"] == actor
        assert build_plan(qwen7b(), cfg, 8, None).micro_batch == plan
    assert LOGPROB_CHUNK_GIB == CHUNK_BYTES / GIB


def test_without_a_device_there_is_no_vllm_share_and_no_verdict():
    plan = build_plan(qwen7b(), load_config(GPU_7B), 8, None)
    assert items(plan)["vLLM awake"] == (None, 0.0)
    assert plan.peak("rollout") is None and plan.peak_phase[0] == "train"
    assert plan.fits is None and plan.problems == ()


# -- DeepSpeed's estimator ---------------------------------------------------------------


def deepspeed_printed_gpu_gib(params: int, largest: int, gpus: int) -> float:
    """The per-GPU figure of the no-offload row that DeepSpeed's all_cold estimator prints."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        estimate_zero3_model_states_mem_needs_all_cold(params, largest, num_gpus_per_node=gpus,
                                                       num_nodes=1)
    row = next(line for line in printed.getvalue().splitlines()
               if "offload_param=none, offload_optimizer=none, zero_init=1" in line)
    return float(re.findall(r"([\d.]+)GB", row)[1])


def test_the_7b_plan_agrees_with_deepspeeds_zero3_estimator():
    """8 x 80 GiB, ZeRO-3, bf16, Adam: the plan's weights + gradients + optimizer states
    (2 + 2 + 16 B/param over 8 ranks: 17.7 GiB) against DeepSpeed's 18 B/param over 8 ranks
    + 4 B x the largest layer (18.0 GiB)."""
    shape = qwen7b()
    cfg = load_config(GPU_7B)
    ours = build_plan(shape, cfg, 8, 80.0).model_states_gib
    printed = deepspeed_printed_gpu_gib(shape.params, shape.largest_layer, 8)
    estimate, source = model_states_gib(3, shape.params, shape.largest_layer, 8)
    assert estimate == pytest.approx(printed, abs=0.01)
    assert "estimate_zero3_model_states_mem_needs" in source
    assert abs(ours / estimate - 1) < 0.10
    assert round(ours, 1) == 17.7 and round(estimate, 1) == 18.0


def test_deepspeed_has_no_estimator_for_zero_0_and_1():
    assert model_states_gib(0, 10**9, 10**8, 8) is None
    assert model_states_gib(1, 10**9, 10**8, 8) is None
    gib, source = model_states_gib(2, 10**9, 10**8, 8)  # 2 B/param full + 18 B/param / 8
    assert gib == pytest.approx((2 + 18 / 8) * 10**9 / GIB, rel=1e-6)
    assert "zero2" in source


def test_importing_deepspeed_for_the_estimate_prints_nothing():
    """DeepSpeed's first import logs its accelerator to stdout, which carries the dry run's
    YAML or JSON."""
    code = ("import sys\nfrom pipeline.train.ds_estimate import model_states_gib\n"
            "sys.stdout.write('%.3f' % model_states_gib(3, 7615616512, 544997376, 8)[0])")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "17.989", "")


# -- the sample 7B config on 8 x 80 GiB --------------------------------------------------


def test_the_sample_7b_config_fits_8_x_80_gib_only_with_gradient_checkpointing():
    """Without gradient checkpointing, 8 x 5120-token sequences keep 28 layers of
    activations: about 258 GiB. With it (as gpu-7b.yaml sets) it fits with 2 GiB to
    spare: the rollout phase is vLLM's 0.6 x 80 = 48 GiB + the trainer's states (weights 1.8,
    gradient buffer 1.8, optimizer 10.6, reference model 1.8, reduce bucket 0.9) + context
    1.0 + the rejection sampler 12.0 = 77.9 GiB; the train phase is 65.9 GiB (activations
    17.7 and logits 23.7 GiB)."""
    shape = qwen7b()
    without = build_plan(shape, load_config(GPU_7B, ["train.gradient_checkpointing=false"]),
                         8, 80.0)
    assert without.peak_phase[0] == "train"
    (problem,) = without.problems
    assert problem == ("the memory plan needs 306.1 GiB per GPU in the train phase, more "
                              "than the 80.0 GiB GPU (largest: activations 257.9, logits 23.7, "
                              "optimizer states 14.2 GiB); to fit: enable "
                              "train.gradient_checkpointing, lower train.ppo_micro_batch_size "
                              "(now 8) or lower rollout.max_tokens")
    fixed = build_plan(shape, load_config(GPU_7B), 8, 80.0)
    assert fixed.fits and fixed.problems == ()
    p = shape.params / GIB
    rollout = (48 + (2 + 2 + 12 + 2) * p / 8 + 2 * REDUCE_BUCKET / GIB + CONTEXT_GIB
               + sampler_gib(512, 8, checks=True))
    assert fixed.peak("rollout") == pytest.approx(rollout)
    assert round(fixed.peak("rollout"), 1) == 77.9 and round(fixed.peak("train"), 1) == 65.9
    assert round(items(fixed)["activations"][1], 1) == 17.7
    assert round(items(fixed)["logits"][1], 1) == 23.7
    assert items(fixed)["vLLM asleep"] == (0.0, CUDA_GRAPHS_GIB)  # enforce_eager: false


QWEN_VOCAB = 152064


def sampler_gib(rows: int, drafts: int, checks: bool, vocab: int = QWEN_VOCAB) -> float:
    """The rejection sampler beyond vLLM's profile, by hand (vllm/v1/sample/
    rejection_sampler.py, gpu_model_runner._dummy_sampler_run): T = rows x drafts draft
    positions. fp32 rows of the vocabulary alive at its peak: the target logits, the clone
    the logits processors change and the softmax (3 T) with two [rows, V] Gumbel tensors,
    or on log-prob-check steps the first two with the final logits, the accepted logits
    and their log-softmax (2 T + 3 (T + rows)); the profile had 5 x rows of them (one
    draft per request). The pass's bf16 logits hold T + rows rows, the profile's 2 x rows."""
    t = rows * drafts
    fp32 = (5 * t + 3 * rows if checks else 3 * t + 2 * rows) - 5 * rows
    return (4 * fp32 + 2 * (t - rows)) * vocab / GIB


def test_the_7b_plan_holds_the_rejection_samplers_working_set():
    """vLLM sizes its KV cache after a profile that runs the rejection sampler with one
    draft per request; a full pass of gpu-7b.yaml verifies up to 8 drafts for each of its
    512 sequences, and every 10th step asks for log-probs: 12.0 GiB beyond the profile,
    outside vLLM's share, in the rollout phase only."""
    plan = build_plan(qwen7b(), load_config(GPU_7B), 8, 80.0)
    sampler = items(plan)["rejection sampler"]
    assert sampler == (pytest.approx(sampler_gib(512, 8, checks=True)), 0.0)
    assert round(sampler[0], 1) == 12.0
    assert plan.fits and round(plan.peak("rollout"), 1) == 77.9
    basis = next(i.basis for i in plan.items if i.name == "rejection sampler")
    assert "512 sequences x 8 draft tokens" in basis and "152064" in basis
    # no log-prob checks: three fp32 copies; fewer rows or drafts scale it down
    quiet = build_plan(qwen7b(), load_config(GPU_7B, ["rollout.logprob_check_every=0"]), 8, 80.0)
    assert items(quiet)["rejection sampler"][0] == pytest.approx(sampler_gib(512, 8, False))
    half = build_plan(qwen7b(), load_config(GPU_7B, ["rollout.max_num_seqs=256",
                                                     "spec.num_speculative_tokens=4"]), 8, 80.0)
    assert items(half)["rejection sampler"][0] == pytest.approx(sampler_gib(256, 4, True))
    # a thin pass drafts longer (spec.thin_draft_tokens) but verifies at most
    # spec.thin_pass_tokens in all: with few sequences that bounds the draft positions
    few = build_plan(qwen7b(), load_config(GPU_7B, ["rollout.max_num_seqs=16"]), 8, 80.0)
    assert items(few)["rejection sampler"][0] == pytest.approx(
        (4 * (5 * 296 + 3 * 16 - 5 * 16) + 2 * (296 - 16)) * QWEN_VOCAB / GIB)
    vllm_method = build_plan(qwen7b(), load_config(GPU_7B, ["spec.method=suffix",
                                                            "rollout.max_num_seqs=16"]), 8, 80.0)
    assert items(vllm_method)["rejection sampler"][0] == pytest.approx(sampler_gib(16, 8, True))
    off = build_plan(qwen7b(), load_config(GPU_7B, ["spec.method=none"]), 8, 80.0)
    assert items(off)["rejection sampler"] == (0.0, 0.0)
    # sampled model drafts: their probabilities, twice (the proposer's and vLLM's copy)
    model = ["spec.method=history+group+model"]
    sampled = build_plan(qwen7b(), load_config(GPU_7B, model), 8, 80.0)
    greedy = build_plan(qwen7b(), load_config(GPU_7B, model + ["spec.draft_probs=false"]),
                        8, 80.0)
    t = 512 * 8
    assert items(sampled)["rejection sampler"][0] - items(greedy)["rejection sampler"][0] == \
        pytest.approx(2 * 4 * t * QWEN_VOCAB / GIB)
    assert items(greedy)["rejection sampler"] == items(plan)["rejection sampler"]
    assert "draft probabilities" in next(i.basis for i in sampled.items
                                         if i.name == "rejection sampler")
    # at 80 GB they tip the 7B plan over, and the refusal names the setting
    assert greedy.fits and not sampled.fits
    assert any("spec.draft_probs=false" in p for p in sampled.problems)
    # spec.max_draft_rows: only passes of at most 128 requests verify drafts
    capped = build_plan(qwen7b(), load_config(GPU_7B, ["spec.max_draft_rows=128"]), 8, 80.0)
    t = 128 * 8
    assert items(capped)["rejection sampler"][0] == pytest.approx(
        (4 * (5 * t + 3 * 128 - 5 * 512) + 2 * (t + 128 - 2 * 512)) * QWEN_VOCAB / GIB)
    tiny = build_plan(qwen7b(), load_config(GPU_7B, ["spec.max_draft_rows=16"]), 8, 80.0)
    assert items(tiny)["rejection sampler"][0] == 0.0  # within what the profile held


def test_a_utilization_remedy_leaves_room_for_the_rejection_sampler():
    """Lowering vLLM's share to the utilization the plan names fits, sampler included."""
    cfg = load_config(GPU_7B, ["rollout.gpu_memory_utilization=0.9"])
    (problem,) = build_plan(qwen7b(), cfg, 8, 80.0).problems
    util = float(re.search(r"lower rollout.gpu_memory_utilization to ([\d.]+)", problem)[1])
    assert util == 0.62
    fixed = build_plan(qwen7b(), replace(cfg, rollout=replace(
        cfg.rollout, gpu_memory_utilization=util)), 8, 80.0)
    assert fixed.fits


def test_the_utilization_a_too_small_share_is_told_not_to_exceed_fits():
    cfg = load_config(GPU_7B, ["rollout.gpu_memory_utilization=0.1"])
    (problem,) = build_plan(qwen7b(), cfg, 8, 80.0).problems
    assert "but not above 0.62 (" in problem
    for util in (0.62, 0.63):
        raised = build_plan(qwen7b(), replace(cfg, rollout=replace(
            cfg.rollout, gpu_memory_utilization=util)), 8, 80.0)
        assert raised.fits is (util == 0.62)
    # a GPU without room for the weights beside the rest: no utilization is named
    small = build_plan(qwen7b(), cfg, 8, 32.0).problems[0]
    assert small.endswith("(the rest is its KV cache) but the trainer's states, the rejection "
                          "sampler and the CUDA context leave it only 2.1 GiB")


def test_a_rollout_share_that_crowds_out_the_trainer_names_a_utilization_that_fits():
    cfg = load_config(GPU_7B, ["train.gradient_checkpointing=true",
                               "rollout.gpu_memory_utilization=0.9"])
    (problem,) = build_plan(qwen7b(), cfg, 8, 80.0).problems
    assert problem.startswith("the memory plan needs 101.9 GiB per GPU in the rollout phase")
    assert problem.endswith("(largest: vLLM awake 72.0, rejection sampler 12.0, optimizer "
                            "states 10.6 GiB); to fit: lower rollout.gpu_memory_utilization to "
                            "0.62, lower spec.num_speculative_tokens (now 8) or lower "
                            "rollout.max_num_seqs (now 512)")


def test_vllm_needs_room_for_its_weights():
    cfg = load_config(GPU_7B, ["train.gradient_checkpointing=true",
                               "rollout.gpu_memory_utilization=0.1"])
    assert build_plan(qwen7b(), cfg, 8, 80.0).problems == (
        "rollout.gpu_memory_utilization = 0.1 gives vLLM 8.0 GiB of the 80.0 GiB GPU, less "
        "than its 14.2 GiB of weights; raise it well above 0.18 (the rest is its KV cache) "
        "but not above 0.62 (the trainer's states, the rejection sampler and the CUDA "
        "context take the rest)",)
    fp32 = load_config(GPU_7B, ["model.dtype=float32", "train.gradient_checkpointing=true"])
    assert build_plan(qwen7b(), fp32, 8, 24.0).problems[0] == (
        "vLLM's weights (28.4 GiB in float32) do not fit the 24.0 GiB GPU; set model.dtype: "
        "bfloat16 or raise rollout.tensor_parallel_size (now 1)")


# -- rhymectl train --------------------------------------------------------------------


def cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return (info.value.code or 0), out, err


@pytest.fixture
def model_7b(tmp_path) -> Path:
    """Qwen2.5-7B's config.json with a char tokenizer and an empty weights file: enough for
    every dry-run check (no weights are read)."""
    from pipeline.policy.tokenizer import train_char_tokenizer

    d = tmp_path / "qwen7b"
    d.mkdir()
    train_char_tokenizer(["sort 0123456789:"]).save_pretrained(d)
    shutil.copy(QWEN_7B, d / "config.json")
    (d / "model.safetensors").write_bytes(b"")
    return d


@pytest.fixture
def prompts(tmp_path) -> Path:
    rows = [{"prompt": f"sort {n}:", "answer": "".join(sorted(str(n)))} for n in range(10, 26)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_7b(model_7b, prompts, *extra) -> list:
    return ["train", TINY, f"model.path={model_7b}", f"data.path={prompts}",
            "model.dtype=bfloat16", "deepspeed.bf16=true", *extra]


REFUSED_24 = ("the memory plan needs 143.5 GiB per GPU in the train phase, more than the "
              "24.0 GiB GPU (largest: optimizer states 113.5, policy weights 14.2, gradients "
              "14.2 GiB); to fit: run more ranks (--nproc) with deepspeed.zero_stage 3")


def test_a_plan_that_cannot_fit_is_refused_in_one_line(capsys, model_7b, prompts):
    """The 7B policy on one 24 GiB GPU with ZeRO-0: bf16 weights and gradients (2 + 2 B/param)
    and the optimizer's 16 B/param at the step are 142 GiB before any activation."""
    code, out, err = cli(capsys, *run_7b(model_7b, prompts, "deepspeed.zero_stage=0",
                                         "rollout.gpu_memory_utilization=0.7",
                                         "train.gradient_checkpointing=true",
                                         "train.ppo_micro_batch_size=1"),
                         "--gpu-mem-gib", "24", "--dry-run")
    assert (code, out, err) == (2, "", f"error: {REFUSED_24}\n")


def test_a_real_run_is_refused_on_a_gpu_too_small_before_anything_starts(capsys, monkeypatch,
                                                                          model_7b, prompts):
    monkeypatch.setattr("pipeline.loop.memory.detected_device", lambda: (24.0, "Small GPU"))
    monkeypatch.setattr("pipeline.loop.launch.launch", lambda *a, **k: pytest.fail("launched"))
    code, out, err = cli(capsys, *run_7b(model_7b, prompts, "deepspeed.zero_stage=0",
                                         "rollout.gpu_memory_utilization=0.7",
                                         "train.gradient_checkpointing=true",
                                         "train.ppo_micro_batch_size=1"))
    assert (code, out, err) == (2, "", f"error: {REFUSED_24}\n")


def test_a_dry_run_prints_the_plan_as_comments_of_the_config(capsys, model_7b, prompts):
    code, out, err = cli(capsys, *run_7b(model_7b, prompts, "deepspeed.zero_stage=3",
                                         "train.gradient_checkpointing=true",
                                         "rollout.gpu_memory_utilization=0.5"),
                         "--nproc", "8", "--gpu-mem-gib", "80", "--dry-run")
    assert (code, err) == (0, "")
    assert yaml.safe_load(out)["model"]["path"] == str(model_7b)  # still a loadable config
    lines = out.splitlines()
    plan = lines[lines.index(next(line for line in lines if "memory plan" in line)):]
    assert all(line.startswith("#") for line in plan)
    assert re.search(r"^# optimizer states +10\.6 +14\.2$", out, re.M)
    assert re.search(r"^# vLLM awake +40\.0 +0\.0$", out, re.M)  # 0.5 x 80
    assert "# device: 80 GiB (--gpu-mem-gib): fits, peak " in out
    assert ("# model states (weights, gradients, optimizer; train phase): 17.7 GiB; DeepSpeed "
            "estimate_zero3_model_states_mem_needs (no offload): 18.0 GiB") in out
    assert "#   activations: 8 sequences x 192 tokens" in out  # 1 prompt x rollout.n 8
    assert lines[-1].startswith("# checks passed: world_size=8")


def test_without_a_gpu_the_plan_is_shown_without_a_verdict(capsys, model_7b, prompts):
    code, out, err = cli(capsys, *run_7b(model_7b, prompts), "--dry-run")
    assert (code, err) == (0, "")
    assert "# device: none (CPU run; pass --gpu-mem-gib to check a GPU plan)\n" in out
    assert re.search(r"^# vLLM awake +8% of GPU +0\.0$", out, re.M)
    assert re.search(r"^# peak +- +\d", out, re.M)


def test_the_json_report_holds_the_plan(capsys, model_7b, prompts):
    code, out, err = cli(capsys, *run_7b(model_7b, prompts, "deepspeed.zero_stage=3",
                                         "rollout.gpu_memory_utilization=0.5"),
                         "--nproc", "8", "--gpu-mem-gib", "80", "--dry-run", "--json")
    assert (code, err) == (0, "")
    plan = json.loads(out)["memory_plan"]
    assert plan["params"] == QWEN_7B_PARAMS and plan["world_size"] == 8
    assert plan["device_gib"] == 80.0 and plan["fits"] is True and plan["problems"] == []
    assert plan["peak"]["phase"] == "rollout"
    assert plan["peak"]["gib"] == pytest.approx(sum(i["rollout_gib"] for i in plan["items"]))
    assert {i["name"] for i in plan["items"]} >= {
        "policy weights", "gradients", "optimizer states", "reference model", "vLLM awake",
        "vLLM asleep", "activations", "logits", "ZeRO buffers"}
    assert all(i["basis"] for i in plan["items"])
    assert plan["deepspeed"]["gib"] == pytest.approx(17.99, abs=0.01)


def test_a_model_the_plan_cannot_count_only_says_so(capsys, tmp_path, model_7b, prompts):
    (model_7b / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    code, out, err = cli(capsys, *run_7b(model_7b, prompts), "--gpu-mem-gib", "24", "--dry-run")
    assert (code, err) == (0, "")
    assert "# memory plan: not available (config.json has no hidden_size)\n" in out
    code, out, _ = cli(capsys, *run_7b(model_7b, prompts), "--dry-run", "--json")
    assert json.loads(out)["memory_plan"] == {"unavailable": "config.json has no hidden_size"}


def test_a_draft_model_on_the_gpu_is_counted_and_named_in_the_remedies():
    """history+group+model with spec.draft_device cuda (or auto) holds its fp32 draft on
    the GPU: weights and the requests' keys and values in the rollout, its training's
    states and activations in the train phase; on the CPU (the default) nothing."""
    from pipeline.drafting.draft_model import shape_for

    config = {**SMALL, "model_type": "llama"}
    shape = ModelShape.from_config(config)
    base = ["spec.method=history+group+model", "rollout.max_num_seqs=64"]
    cpu = build_plan(shape, load_config(TINY, base), 1, 80.0)
    assert "draft model" not in [i.name for i in cpu.items]
    plan = build_plan(shape, load_config(TINY, base + ["spec.draft_device=cuda"]), 1, 80.0)
    draft = next(i for i in plan.items if i.name == "draft model")
    params = shape_for(config).parameters()
    assert 4 * params / GIB < draft.rollout and 16 * params / GIB < draft.train
    assert plan.peak("train") == pytest.approx(cpu.peak("train") + draft.train)
    tight = build_plan(shape, load_config(TINY, base + ["spec.draft_device=auto"]), 1,
                       cpu.peak("train") + draft.train / 2)
    assert any("draft model" in p and "set spec.draft_device=cpu" in p for p in tight.problems)


def test_the_draft_models_training_activations_are_one_piece_of_a_minibatch(monkeypatch):
    """The draft's update runs a long minibatch in pieces of MICRO_TOKENS padded tokens
    (pipeline.drafting.draft_targets.pieces): the plan counts one piece's activations, so
    at gpu-7b.yaml's 5k-token sequences the train item grows with the piece, not with the
    32 responses of a minibatch."""
    from pipeline import draft_shape

    cfg = load_config(GPU_7B, ["spec.method=history+group+model", "spec.draft_device=cuda"])

    def train_gib(tokens):
        monkeypatch.setattr(draft_shape, "MICRO_TOKENS", tokens)
        item = next(i for i in build_plan(qwen7b(), cfg, 8, 80.0).items if i.name == "draft model")
        return item.train, item.basis

    small, basis = train_gib(1 << 14)
    assert "the activations of 16384 tokens of a 32-response minibatch" in basis
    double, _ = train_gib(1 << 15)
    whole, _ = train_gib(1 << 30)  # no limit: the whole minibatch of 32 x 5,120 tokens
    per_token = (double - small) / (1 << 14)
    assert per_token > 0
    assert whole - small == pytest.approx(per_token * (32 * 5120 - (1 << 14)), rel=1e-6)
    assert small < whole / 2
