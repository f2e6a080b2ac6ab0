"""scripts/check_gpu_stack.py's pure parts: pins, the report summary, pip's failures.

pip's outputs below are as pip 23.2 prints them; nothing here reaches the network.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_gpu_stack",
                                               ROOT / "scripts" / "check_gpu_stack.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)

WHERE = "CPython 3.11 on Linux x86_64"


def test_read_pins_keeps_exact_pins_in_order_with_canonical_names():
    text = """# comment
vllm==0.32.0
Flashinfer_Python == 0.7.0.post1  # why
-r requirements/base.txt
transformers>=5.0
nvidia-cutlass-dsl[cu13]==4.8.0
"""
    assert list(check.read_pins(text).items()) == [
        ("vllm", "0.32.0"), ("flashinfer-python", "0.7.0.post1"), ("nvidia-cutlass-dsl", "4.8.0")]


def test_the_check_resolves_setup_sh_gpu_list():
    args = check.requirement_args()
    assert "vllm==0.32.0" in args and "torch==2.13.0" in args
    assert args[-2:] == ["-c", check.CONSTRAINTS]
    files = [args[i + 1] for i, a in enumerate(args) if a in ("-r", "-c")]
    assert files and all((ROOT / f).is_file() for f in files)


def _report(vllm_requires):
    def item(name, version, requires=None):
        return {"metadata": {"name": name, "version": version, "requires_dist": requires}}
    return {"environment": {"implementation_name": "cpython", "python_version": "3.11",
                            "sys_platform": "linux", "platform_machine": "x86_64"},
            "install": [item("vllm", "0.32.0", vllm_requires), item("torch", "2.13.0"),
                        item("TorchAudio", "2.11.0")]}


def test_summary_names_versions_and_vllm_own_pins():
    requires = ["torch==2.13.0", "torchaudio==2.11.0", "numpy", 'zentorch==2.13.0.1; extra == "zen"',
                'tokenspeed-mla==0.2.15; platform_system == "Linux"']
    line, warnings = check.summarize(_report(requires),
                                     {"vllm": "0.32.0", "torch": "2.13.0", "torchaudio": "2.11.0"})
    assert warnings == []
    assert "3 packages for cpython 3.11 on linux x86_64" in line
    assert "vllm 0.32.0, torch 2.13.0, torchaudio 2.11.0" in line
    assert line.endswith("vllm 0.32.0 itself requires torch==2.13.0, torchaudio==2.11.0")


def test_summary_warns_of_stale_and_disagreeing_pins():
    pins = {"vllm": "0.32.0", "torch": "2.12.0", "flashinfer-python": "0.7.0"}
    _, warnings = check.summarize(_report(["torch==2.13.0"]), pins)
    assert warnings == [
        f"warning: {check.CONSTRAINTS} pins flashinfer-python==0.7.0 but nothing installs it "
        "(a stale pin)",
        f"warning: {check.CONSTRAINTS} pins torch==2.12.0 but vllm 0.32.0 requires torch==2.13.0"]


CONFLICT_OUT = """\
INFO: pip is looking at multiple versions of torchvision to determine which version is compatible with other requirements. This could take a while.
ERROR: Cannot install vllm==0.32.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    vllm 0.32.0 depends on torchaudio==2.11.0
    The user requested (constraint) torchaudio==2.11.1

To fix this you could try to:
1. loosen the range of package versions you've specified

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts
"""
UNANSWERED_OUT = """\
WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPConnection object at 0x7f>: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/torch/
ERROR: Cannot install torch==2.13.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch==2.13.0
    The user requested (constraint) torch==2.13.0

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/
"""
NO_RELEASE_OUT = UNANSWERED_OUT.split("\n", 1)[1]  # the same, with the index answering


@pytest.mark.parametrize("output, status, line", [
    (CONFLICT_OUT, 1, "error: TARGET=gpu's requirements conflict: vllm 0.32.0 depends on "
     "torchaudio==2.11.0; The user requested (constraint) torchaudio==2.11.1; fix the pins in "
     "requirements/gpu-constraints.txt (or scripts/setup.sh)"),
    (UNANSWERED_OUT, 3, "error: cannot check here: the package index did not answer; check "
     "the network (or pass --index-url) and run it again"),
    (NO_RELEASE_OUT, 3, "error: cannot check here: no release of torch==2.13.0 installable on "
     "CPython 3.11 on Linux x86_64 (none is built for it, or the pin names none)"),
    ("ERROR: Could not find a version that satisfies the requirement torchaudio==2.99.0 (from "
     "versions: 2.0.0, 2.10.0, 2.11.0, 2.11.1)\n"
     "ERROR: No matching distribution found for torchaudio==2.99.0\n", 1,
     "error: no release matches torchaudio==2.99.0 (the index has ... 2.0.0, 2.10.0, 2.11.0, "
     "2.11.1); fix the pins in requirements/gpu-constraints.txt (or scripts/setup.sh)"),
    ("ERROR: Could not find a version that satisfies the requirement vllm==0.32.0 (from "
     "versions: none)\nERROR: No matching distribution found for vllm==0.32.0\n", 3,
     "error: cannot check here: no release of vllm==0.32.0 installable on CPython 3.11 on "
     "Linux x86_64 (none is built for it, or no such package)"),
    ("Collecting deepspeed==0.19.8\n  error: subprocess-exited-with-error\n"
     "error: metadata-generation-failed\n", 3,
     "error: cannot check here: a source distribution's metadata does not build on this "
     "machine (Collecting deepspeed==0.19.8)"),
    ("Usage: pip install [options]\nno such option: --dry-run\n", 3,
     "error: cannot check here: this pip has no --dry-run/--report (needs pip 22.2 or newer)"),
    ("ERROR: Disk quota exceeded\n", 3,
     "error: cannot check here: pip failed: ERROR: Disk quota exceeded"),
])
def test_diagnose_tells_a_conflict_from_a_check_that_cannot_run(output, status, line):
    assert check.diagnose(output, WHERE) == (status, line)


def test_two_different_requests_of_one_package_are_a_conflict():
    out = NO_RELEASE_OUT.replace("(constraint) torch==2.13.0", "(constraint) torch==2.12.0")
    status, line = check.diagnose(out, WHERE)
    assert status == 1 and "torch==2.12.0" in line
