"""YAML + dotted overrides → a validated, frozen `Config`.

Every problem is collected before anything is raised, so one run of `--dry-run` shows all
of them: the key, the bad value and what is allowed; unknown keys get a did-you-mean.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from pipeline.config.methods import DRAFTER_METHODS, REGISTRY, method
from pipeline.config.schema import Config, SpecConfig
from pipeline.errors import UsageError, require_file


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-4` as a float (YAML 1.2 does; PyYAML's 1.1 does not)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _safe_load(text: str):
    return yaml.load(text, Loader=_Loader)  # noqa: S506 — a SafeLoader subclass


class ConfigError(UsageError):
    """All problems of one config, one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        head = f"config has {len(problems)} problem{'s' if len(problems) > 1 else ''}"
        super().__init__(head + ":\n  " + "\n  ".join(problems) if len(problems) > 1 else problems[0])


def read_yaml(path: str | Path) -> dict:
    """Load a YAML mapping safely (no object construction)."""
    path = Path(path)
    require_file(path, "config file", "pass the path of a YAML file (see sample_configs/)")
    try:
        data = _safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"config file {path} is not valid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping of sections "
                         f"(data:, model:, rollout:, ...), not a {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """`rollout.n=4` → (["rollout", "n"], 4).

    The value is parsed as YAML (safe) unless the key names a string field, whose value is
    taken verbatim (paths with `#`, `module:function`, a directory called `2024`).
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"override '{text}' is not key=value; write e.g. rollout.n=8")
    path = key.strip().split(".")
    if _is_string_field(path) and raw.strip() not in ("null", "~", ""):
        return path, raw.strip()
    try:
        value = _safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def _is_string_field(path: list[str]) -> bool:
    cls = Config
    for part in path:
        if not is_dataclass(cls) or part not in {f.name for f in fields(cls)}:
            return False
        cls = typing.get_type_hints(cls)[part]
    if get_origin(cls) in (Union, types.UnionType):
        cls = next(a for a in get_args(cls) if a is not type(None))
    return cls is str


def apply_overrides(tree: dict, overrides: list[str]) -> dict:
    """Set each dotted key in a copy of `tree` (sections are created as needed)."""
    tree = {k: (dict(v) if isinstance(v, dict) else v) for k, v in tree.items()}
    for text in overrides:
        path, value = parse_override(text)
        node = tree
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
    return tree


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read, override and validate; raises ConfigError listing every problem."""
    tree = read_yaml(path) if path is not None else {}
    tree = apply_overrides(tree, list(overrides))
    problems: list[str] = []
    cfg = _build(Config, tree, "", problems)
    if problems:
        raise ConfigError(problems)
    problems = cross_checks(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


MAX_DRAFT_DISTILL = 64  # spec.draft_distill's most


def cross_checks(cfg: Config) -> list[str]:
    """Constraints between fields."""
    out = []
    if cfg.data.task is None and cfg.data.path is None:
        out.append("data.task and data.path are both null; set data.task to a built-in task "
                   "or data.path to a data set")
    if cfg.train.ppo_mini_batch_size > cfg.data.train_batch_size:
        out.append(f"train.ppo_mini_batch_size = {cfg.train.ppo_mini_batch_size} is larger than "
                   f"data.train_batch_size = {cfg.data.train_batch_size}; it must be <= it")
    elif cfg.data.train_batch_size % cfg.train.ppo_mini_batch_size:
        out.append(f"data.train_batch_size = {cfg.data.train_batch_size} is not a multiple of "
                   f"train.ppo_mini_batch_size = {cfg.train.ppo_mini_batch_size}")
    if cfg.spec.pass_cost == "online" and cfg.spec.budget == "critical" \
            and cfg.rollout.tensor_parallel_size > 1:
        out.append(f"spec.pass_cost = online with rollout.tensor_parallel_size = "
                   f"{cfg.rollout.tensor_parallel_size}: each rank of a tensor-parallel group "
                   f"would size drafts by its own measured seconds, and ranks that schedule "
                   f"different tokens hang in their collectives; use spec.pass_cost=fixed")
    if cfg.spec.draft_device != "cpu" and method(cfg.spec.method).model \
            and cfg.rollout.tensor_parallel_size > 1:
        out.append(f"spec.draft_device = {cfg.spec.draft_device} with "
                   f"rollout.tensor_parallel_size = {cfg.rollout.tensor_parallel_size}: each "
                   f"rank of a tensor-parallel group trains its own draft model, on a GPU not "
                   f"bit for bit alike, and ranks that draft differently hang in their "
                   f"collectives; use spec.draft_device=cpu")
    if cfg.spec.draft_distill > MAX_DRAFT_DISTILL:
        out.append(f"spec.draft_distill = {cfg.spec.draft_distill}: the policy's most likely "
                   f"tokens the draft learns at each response token, at most "
                   f"{MAX_DRAFT_DISTILL} (each costs 6 bytes a token in the draft's window "
                   f"and checkpoints; 8, the default, carry nearly all the mass); use 1 to "
                   f"{MAX_DRAFT_DISTILL}, or 0 for the sampled tokens")
    served_by = method(cfg.spec.method).vllm_method
    if cfg.spec.min_accept and (cfg.spec.budget != "tree" or served_by is not None
                                or cfg.spec.method == "none"):
        out.append(f"spec.min_accept = {cfg.spec.min_accept} cuts the tree budget's drafts "
                   f"of rhymectl's drafters ({', '.join(DRAFTER_METHODS)}) and spec.budget "
                   f"is {cfg.spec.budget}, spec.method {cfg.spec.method}: remove it, or use "
                   f"spec.budget=tree with one of those methods")
    if cfg.spec.max_draft_rows is not None and served_by is not None:
        out.append(f"spec.max_draft_rows = {cfg.spec.max_draft_rows} applies to rhymectl's "
                   f"drafters ({', '.join(DRAFTER_METHODS)}); vLLM's {served_by} proposer "
                   f"drafts in every pass: remove it or use one of them")
    return out


def draft_model_problems(cfg: Config) -> list[str]:
    """A training run's spec.draft_* settings without a draft model (a bench, which runs
    other methods than the config's, may set them)."""
    if method(cfg.spec.method).model:
        return []
    defaults, out = SpecConfig(), []
    with_model = [n for n, m in REGISTRY.items() if m.model]
    for key in ("draft_layers", "draft_updates", "draft_window", "draft_lr", "draft_vocab",
                "draft_device", "draft_probs", "draft_distill", "draft_warmup",
                "draft_warmup_prompts", "draft_warmup_updates"):
        value = getattr(cfg.spec, key)
        if value != getattr(defaults, key):
            out.append(f"spec.{key} = {value} applies to a draft model "
                       f"({', '.join(with_model)}), and spec.method is {cfg.spec.method}: "
                       f"remove it or use that method")
    return out


def _build(cls, raw: Any, prefix: str, problems: list[str]):
    if not isinstance(raw, dict):
        problems.append(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {raw!r}")
        return cls()
    known = {f.name: f for f in fields(cls)}
    for key in raw:
        if key not in known:
            problems.append(_unknown_key(prefix, str(key), list(known)))
    values = {}
    for name, f in known.items():
        if name not in raw:
            continue
        key = prefix + name
        hint = typing.get_type_hints(cls)[name]
        if is_dataclass(hint):
            values[name] = _build(hint, raw[name], key + ".", problems)
            continue
        ok, value, allowed = _coerce(raw[name], hint)
        if not ok:
            read_as = " (YAML reads off, no and false as False: quote the word)" \
                if isinstance(raw[name], bool) and get_origin(hint) is Literal else ""
            problems.append(f"{key} = {raw[name]!r}{read_as} is not allowed; expected {allowed}")
            continue
        check = f.metadata.get("check")
        if check and value is not None and not check[1](value):
            problems.append(f"{key} = {value!r} is not allowed; expected {check[0]}")
            continue
        values[name] = value
    return cls(**values)


def _unknown_key(prefix: str, key: str, known: list[str]) -> str:
    where = prefix.rstrip(".") or "the top level"
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    hint = f"; did you mean {prefix}{close[0]}?" if close else f"; valid keys: {', '.join(known)}"
    return f"unknown key {prefix}{key} in {where}{hint}"


def _coerce(value: Any, hint) -> tuple[bool, Any, str]:
    """Check `value` against a type hint; ints are accepted for floats."""
    origin = get_origin(hint)
    if origin is Literal:
        choices = get_args(hint)
        return value in choices, value, "one of " + ", ".join(map(str, choices))
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if value is None:
            return True, None, "null"
        ok, v, allowed = _coerce(value, args[0])
        return ok, v, allowed + " or null"
    if origin is tuple:  # tuple[X, ...]: a YAML list, each item an X
        item = get_args(hint)[0]
        allowed = "a list of " + _coerce(None, item)[2].removeprefix("one of ")
        if not isinstance(value, (list, tuple)):
            return False, value, allowed
        items = [_coerce(v, item) for v in value]
        return all(ok for ok, _, _ in items), tuple(v for _, v, _ in items), allowed
    if hint is bool:
        return isinstance(value, bool), value, "true or false"
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value, "an integer"
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value, "a number"
    if hint is str:
        return isinstance(value, str), value, "a string"
    return True, value, str(hint)


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def to_yaml(cfg) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)

