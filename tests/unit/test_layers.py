"""The layer rule, read from the source: every import of every module of `pipeline` and
`rhymectl` (at module top or inside a function) goes to its own layer or below, and the
packages form no import cycle. And every module of `pipeline` serves the tool: it is reached
from an entry point (research helpers that only scripts/ and tests use live in scripts/).

Draft budgets are used through their protocol: no module outside `pipeline.drafting` asks
which budget class it holds (`isinstance` / `issubclass` on a budget class).

Layers, bottom to top (README "Layout"):
  1 kernel    errors, atomic, config, distributed, costs, children
  2 logic     tasks, history, drafting, sched, train.grpo
  3 adapters  rollout (vLLM), train (DeepSpeed), policy
  4 loop
  5 bench, report
  6 rhymectl  (the CLI)
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("pipeline", "rhymectl")

# Most specific prefix wins; a module matches a prefix equal to it or below it.
LAYERS: dict[str, int] = {
    "pipeline": 1, "pipeline.errors": 1, "pipeline.atomic": 1, "pipeline.config": 1,
    "pipeline.distributed": 1, "pipeline.costs": 1, "pipeline.faults": 1, "pipeline.children": 1,
    "pipeline.tasks": 2, "pipeline.history": 2, "pipeline.drafting": 2, "pipeline.sched": 2,
    "pipeline.train.grpo": 2, "pipeline.train.teacher": 2,
    "pipeline.rollout": 3, "pipeline.train": 3, "pipeline.policy": 3,
    "pipeline.loop": 4,
    "pipeline.bench": 5, "pipeline.report": 5,
    "rhymectl": 6,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))}


MODULES = all_modules()


def layer(module: str) -> int:
    best = max((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")),
               key=len, default=None)
    if best is None:
        raise AssertionError(f"{module} is in no layer; add it to LAYERS (and the README)")
    return LAYERS[best]


def package(module: str) -> str:
    """The unit of the cycle check: `pipeline.X` (or `rhymectl`)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "pipeline" and len(parts) > 1 else parts[0]


def imports(module: str, path: Path) -> set[str]:
    """Project modules `module` imports, wherever the import statement sits."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports pkg.mod when that is a module
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in ROOTS)
    found.discard(module)
    return found


GRAPH = {m: imports(m, p) for m, p in MODULES.items()}


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
                  for m, targets in graph.items() for t in targets if layer(t) > layer(m))


def package_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the package graph as [a, b, ..., a], or None."""
    edges: dict[str, set[str]] = {}
    for m, targets in graph.items():
        for t in targets:
            if package(t) != package(m):
                edges.setdefault(package(m), set()).add(package(t))
    return first_cycle(edges)


def module_cycle(graph: dict[str, set[str]], within: str) -> list[str] | None:
    """One import cycle among the modules of package `within`, or None."""
    inside = {m: {t for t in targets if t.startswith(within + ".")}
              for m, targets in graph.items() if m.startswith(within + ".")}
    return first_cycle(inside)


def first_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of a directed graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(p: str) -> list[str] | None:
        state[p] = 1
        stack.append(p)
        for q in sorted(edges.get(p, ())):
            if state.get(q) == 1:
                return stack[stack.index(q):] + [q]
            if q not in state and (cycle := visit(q)):
                return cycle
        stack.pop()
        state[p] = 2
        return None

    for p in sorted(edges):
        if p not in state and (cycle := visit(p)):
            return cycle
    return None


def test_every_module_has_a_layer():
    assert MODULES and all(layer(m) for m in MODULES)


def test_no_module_imports_from_a_layer_above_its_own():
    assert upward_edges(GRAPH) == []


def test_the_packages_form_no_import_cycle():
    assert package_cycle(GRAPH) is None


def test_the_placement_modules_form_no_import_cycle():
    """Policies, their settings and the registry that names them import one way: the
    registry imports the policies, never the reverse."""
    assert module_cycle(GRAPH, "pipeline.sched") is None


def test_the_checks_catch_what_they_look_for():
    """The checks fail on a planted upward edge and a planted cycle (so they can fail)."""
    planted = {"pipeline.sched.types": {"pipeline.loop.run"}, "pipeline.loop.run": set()}
    assert upward_edges(planted) == [
        "pipeline.sched.types (layer 2) imports pipeline.loop.run (layer 4)"]
    cyclic = {"pipeline.loop.run": {"pipeline.sched.types"},
              "pipeline.sched.types": {"pipeline.loop.step"}}
    assert package_cycle(cyclic) == ["pipeline.loop", "pipeline.sched", "pipeline.loop"]
    modules = {"pipeline.sched.placement": {"pipeline.sched.tier2", "pipeline.costs"},
               "pipeline.sched.tier2": {"pipeline.sched.placement"}}
    assert module_cycle(modules, "pipeline.sched") == [
        "pipeline.sched.placement", "pipeline.sched.tier2", "pipeline.sched.placement"]


def test_the_library_never_starts_the_cli():
    """No `python -m rhymectl ...` in the library: ranks and bench workers are started
    through the library's own entry points."""
    starts = sorted(m for m, p in MODULES.items() if m.startswith("pipeline")
                    for node in ast.walk(ast.parse(p.read_text()))
                    if isinstance(node, ast.Constant) and node.value == "rhymectl")
    assert starts == []


def _named(node: ast.expr) -> str | None:
    """The name an expression refers to: `X` or `mod.X` -> "X"."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def budget_classes(sources: dict[str, str]) -> set[str]:
    """`Budget` and every class of `pipeline.drafting` derived from it, directly or not."""
    classes = [node for module, text in sources.items() if module.startswith("pipeline.drafting.")
               for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ClassDef)]
    names = {"Budget"}
    grown = True
    while grown:
        before = len(names)
        names |= {c.name for c in classes if any(_named(b) in names for b in c.bases)}
        grown = len(names) > before
    return names


def budget_type_checks(sources: dict[str, str]) -> list[str]:
    """`module:line` of each isinstance / issubclass on a budget class outside drafting."""
    budgets = budget_classes(sources)
    found = []
    for module, text in sources.items():
        if module.startswith("pipeline.drafting."):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and _named(node.func) in ("isinstance", "issubclass") \
                    and len(node.args) == 2:
                kinds = node.args[1]
                kinds = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
                if any(_named(k) in budgets for k in kinds):
                    found.append(f"{module}:{node.lineno}")
    return sorted(found)


SOURCES = {m: p.read_text() for m, p in MODULES.items()}


def test_no_module_outside_drafting_asks_which_budget_it_holds():
    assert {"Budget", "TreeBudget", "ThroughputBudget", "CriticalBudget"} <= budget_classes(SOURCES)
    assert budget_type_checks(SOURCES) == []


def test_the_budget_check_finds_a_type_check_on_a_budget_class():
    sources = {
        "pipeline.drafting.budget_api": "class Budget(Protocol): ...",
        "pipeline.drafting.budget_x": "class XBudget(budget_api.Budget): ...\n"
                                      "class Slow(XBudget): ...\nclass Other: ...",
        "pipeline.rollout.proposer": "if isinstance(b, (int, budget_x.Slow)):\n    pass\n"
                                     "isinstance(b, Other)",
        "pipeline.loop.step": "\n\nissubclass(type(b), XBudget)",
        "pipeline.drafting.build": "isinstance(b, XBudget)",  # inside drafting: allowed
    }
    assert budget_classes(sources) == {"Budget", "XBudget", "Slow"}
    assert budget_type_checks(sources) == ["pipeline.loop.step:3", "pipeline.rollout.proposer:1"]


def entry_points() -> set[str]:
    """Where the tool starts: the CLI (every module of `rhymectl`) and the library's own
    `python -m` modules (a `__main__` guard: the ranks' launch, torchrun's wrapper, the
    bench workers)."""
    return {m for m, p in MODULES.items()
            if m.startswith("rhymectl") or "__name__ == \"__main__\"" in p.read_text()}


def reachable(graph: dict[str, set[str]], roots: set[str]) -> set[str]:
    """The modules `roots` import, directly or not (importing a module imports its
    packages)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += graph.get(m, ())
    return seen


def test_every_library_module_is_reached_from_an_entry_point():
    reached = reachable(GRAPH, entry_points())
    assert sorted(m for m in MODULES if m.startswith("pipeline") and m not in reached) == []


def test_the_reachability_check_finds_a_module_only_scripts_use():
    graph = {"rhymectl.app": {"pipeline.loop.run"}, "pipeline.loop.run": {"pipeline.sched.types"},
             "pipeline.sched.lab": {"pipeline.sched.types"}}
    assert reachable(graph, {"rhymectl.app"}) == {
        "rhymectl", "rhymectl.app", "pipeline", "pipeline.loop", "pipeline.loop.run",
        "pipeline.sched", "pipeline.sched.types"}
    assert {"pipeline.loop.launch", "pipeline.bench.spec_worker",
            "pipeline.bench.sched_real"} <= entry_points()
