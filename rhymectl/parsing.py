"""Command-line lists: `--methods` and `--policies`, and the `--spec` the simulator models.
Each bad value is one UsageError line naming the valid choices."""

from __future__ import annotations

from pipeline.config.methods import METHODS
from pipeline.errors import UsageError
from pipeline.sched.load import SPEC_COST_MODELS
from pipeline.sched.registry import policy_names


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def parse_methods(text: str) -> tuple[str, ...]:
    """Comma-separated method names, `none` first (it is every speedup's reference)."""
    names = _names(text)
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        what = f"unknown method {unknown[0]!r}" if unknown else "no method given"
        raise UsageError(f"--methods: {what}; valid methods: {', '.join(METHODS)}")
    ordered = ["none"] + [n for n in dict.fromkeys(names) if n != "none"]
    return tuple(ordered)


def parse_policies(text: str) -> tuple[str, ...]:
    """'static,seer' -> ('static', 'seer'); UsageError naming the valid ones otherwise."""
    names = _names(text)
    unknown = [n for n in names if n not in policy_names()]
    if unknown or not names:
        what = f"unknown placement policy {unknown[0]!r}" if unknown else "no placement policy given"
        raise UsageError(f"{what} in --policies; choose from {', '.join(policy_names())}")
    return tuple(dict.fromkeys(names))


def check_spec(spec: str) -> str:
    if spec not in SPEC_COST_MODELS:
        raise UsageError(f"--spec {spec!r} is not simulated; choose from {', '.join(SPEC_COST_MODELS)}")
    return spec


__all__ = ["check_spec", "parse_methods", "parse_policies"]
