"""The wheels the offline GPU check needs (requirements/gpu-check.txt, which docs/cluster.md
downloads): everything `import deepspeed` loads beyond torch. A GPU machine without network
has CUDA torch but none of DeepSpeed's own requirements, and `import deepspeed` names only
the first one missing, one failed run at a time.

The list is derived again here from the installed metadata, and `import deepspeed` runs in
a subprocess where only the standard library, torch (with its own requirements) and the
list's distributions can be imported: what a bare GPU machine with the wheels has."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LIST = REPO / "requirements" / "gpu-check.txt"
SCRIPT = REPO / "scripts" / "gpu_check.py"


def requirements_closure(name: str) -> set[str]:
    """Every distribution `name` needs, transitively, without extras (canonical names)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for line in metadata.requires(todo.pop()) or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            dep = canonicalize_name(req.name)
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def listed() -> dict[str, str]:
    """requirements/gpu-check.txt: canonical name -> pinned version."""
    out = {}
    for line in LIST.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = version
    return out


def on_the_bare_machine() -> set[str]:
    """What a GPU machine without DeepSpeed has: torch and torch's requirements."""
    return {"torch"} | requirements_closure("torch")


def test_the_list_is_deepspeeds_requirements_beyond_torch_at_the_pins():
    wanted = requirements_closure("deepspeed") - on_the_bare_machine()
    assert set(listed()) == wanted
    assert listed() == {name: metadata.version(name) for name in wanted}
    assert {"einops", "msgpack", "psutil", "tqdm", "hjson", "pydantic"} <= wanted


def test_the_doc_downloads_the_list():
    doc = (REPO / "docs" / "cluster.md").read_text()
    assert "-r requirements/gpu-check.txt" in doc
    assert "pip wheel deepspeed==0.19.8 --no-deps -w wheels/" in doc


HIDDEN_IMPORT = r"""
import importlib.machinery, json, site, sys
allowed = set(json.loads(sys.argv[1]))
installed = tuple(site.getsitepackages() + [site.getusersitepackages()])

def hidden(name, where):
    return name.partition(".")[0] not in allowed and (where or "").startswith(installed)

class OnlyAllowed(importlib.machinery.PathFinder):
    # an installed top-level module outside `allowed` is not found, as on a machine
    # without it; the standard library stays
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        spec = super().find_spec(name, path, target)
        if spec is None or path is not None:
            return spec
        where = spec.origin or next(iter(spec.submodule_search_locations or []), None)
        return None if hidden(name, where) else spec

sys.meta_path[:] = [f for f in sys.meta_path if f in (importlib.machinery.BuiltinImporter,
                    importlib.machinery.FrozenImporter)] + [OnlyAllowed]
for name, module in list(sys.modules.items()):  # what site's .pth files imported
    if hidden(name, getattr(module, "__file__", None)):
        del sys.modules[name]
import deepspeed
print(deepspeed.__version__)
"""


def import_deepspeed_with_only(distributions: set[str]) -> subprocess.CompletedProcess:
    """`import deepspeed` where only the stdlib and `distributions`' modules import."""
    modules = sorted(module for module, dists in metadata.packages_distributions().items()
                     if {canonicalize_name(d) for d in dists} & distributions)
    return subprocess.run([sys.executable, "-c", HIDDEN_IMPORT, json.dumps(modules)],
                          capture_output=True, text=True, timeout=300, cwd="/",
                          env={"PATH": os.defpath, "CUDA_VISIBLE_DEVICES": "",
                               "DS_ACCELERATOR": "cpu"})


def test_import_deepspeed_needs_nothing_beyond_torch_and_the_list():
    proc = import_deepspeed_with_only(on_the_bare_machine() | {"deepspeed"} | set(listed()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "0.19.8"


def test_the_hiding_is_real():
    """Without one listed distribution the same import fails, naming it."""
    proc = import_deepspeed_with_only(on_the_bare_machine() | {"deepspeed"}
                                      | (set(listed()) - {"einops"}))
    assert proc.returncode != 0
    assert re.search(r"No module named 'einops'", proc.stderr), proc.stderr[-3000:]


# -- scripts/gpu_check.py: every wheel missing named at once ----------------------------

@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def touch_wheels(folder: Path, *names: str) -> None:
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")


def test_the_check_names_every_wheel_the_machine_lacks_at_once(gpu_check, tmp_path):
    touch_wheels(tmp_path, "deepspeed-0.19.8-py3-none-any.whl", "hjson-3.1.0-py3-none-any.whl",
                 "pydantic-2.14.4-py3-none-any.whl")
    installed = {"numpy", "packaging", "tqdm"}
    lacking = gpu_check.lacking_wheels(gpu_check.wheels(tmp_path), installed=installed.__contains__)
    assert lacking == sorted(set(listed()) - installed - {"hjson", "pydantic"})
    assert "einops" in lacking and "msgpack" in lacking and "psutil" in lacking


def test_the_check_installs_only_what_the_machine_lacks(gpu_check, tmp_path):
    """A wheel of a distribution the machine has (numpy beside its torch) is not put in
    front of it on sys.path."""
    touch_wheels(tmp_path, "deepspeed-0.19.8-py3-none-any.whl",
                 "numpy-2.3.5-cp312-cp312-manylinux_2_28_x86_64.whl",
                 "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl")
    chosen = gpu_check.wheels_to_install(gpu_check.wheels(tmp_path),
                                         installed={"numpy"}.__contains__)
    assert [p.name.split("-")[0] for p in chosen] == ["deepspeed", "pydantic_core"]
