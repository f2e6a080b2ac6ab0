"""Does `make setup TARGET=gpu` resolve? pip's dry-run resolver on the same list; installs nothing.

    python3 scripts/check_gpu_stack.py [--index-url URL]          (make check-gpu-stack)

The list is what `TARGET=gpu scripts/setup.sh --print-requirements` prints (torch, vllm,
arctic-inference and its build tools, requirements/base.txt and test-extras.txt, all under
requirements/gpu-constraints.txt). It is resolved at once with `pip install --dry-run
--ignore-installed --report` run by a throwaway virtual environment in a temporary folder:
pip reads wheels' metadata (and builds the metadata of source distributions), installs
nothing, and the project's .venv is not used. pip's own configuration (pip.conf, PIP_*
variables) is ignored so that a machine's local wheel folders or caps cannot stand in for
the index; that index is PyPI unless --index-url names another. The resolve is for the
Python running this script and for this machine's platform (the CUDA wheels are Linux only).

Exit status: 0 it resolves; 1 the pins conflict or name a release that does not exist;
3 the check cannot run here (index unreachable, no release for this Python or platform, a
source distribution whose metadata does not build here, a pip without --dry-run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = "requirements/gpu-constraints.txt"
PYPI = "https://pypi.org/simple"
OK, CONFLICT, CANNOT_CHECK = 0, 1, 3
_NETWORK = ("NewConnectionError", "Could not fetch URL", "ConnectTimeoutError",
            "ReadTimeoutError", "ProxyError", "SSLError", "connection broken by")
_EXACT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([^\s;,#]+)\s*$")


def canonical(name: str) -> str:
    """PEP 503 name: `Flashinfer_Python` -> `flashinfer-python`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    """`name==version` lines of a requirements/constraints file -> {canonical name: version},
    in file order; comments, options (-r, -c) and ranges are skipped."""
    pins = {}
    for line in text.splitlines():
        match = _EXACT.match(line.split("#", 1)[0].strip())
        if match:
            pins[canonical(match.group(1))] = match.group(2)
    return pins


def exact_requirements(requires_dist: list[str]) -> dict[str, str]:
    """The unconditional `name==version` entries of a Requires-Dist list (no marker)."""
    return read_pins("\n".join(r for r in requires_dist if ";" not in r))


def resolved_versions(report: dict) -> dict[str, str]:
    """{canonical name: version} of everything a pip installation report would install."""
    return {canonical(item["metadata"]["name"]): item["metadata"]["version"]
            for item in report.get("install", [])}


def summarize(report: dict, pins: dict[str, str]) -> tuple[str, list[str]]:
    """(the success line, warnings) for a report that resolved.

    Warnings: a pin of the constraints file that nothing installs (stale), and a pin that
    differs from vllm's own exact requirement (pip enforces both, so only a report that did
    not come from these pins shows one)."""
    versions = resolved_versions(report)
    env = report.get("environment", {})
    where = (f"{env.get('implementation_name', '?')} {env.get('python_version', '?')} on "
             f"{env.get('sys_platform', '?')} {env.get('platform_machine', '?')}")
    stack = ", ".join(f"{name} {versions[name]}" for name in pins if name in versions)
    line = (f"check-gpu-stack: TARGET=gpu resolves ({len(versions)} packages for {where}; "
            f"dry run, nothing installed): {stack}")
    warnings = [f"warning: {CONSTRAINTS} pins {name}=={version} but nothing installs it "
                f"(a stale pin)" for name, version in pins.items() if name not in versions]
    vllm = next((item["metadata"] for item in report.get("install", [])
                 if canonical(item["metadata"]["name"]) == "vllm"), None)
    if vllm is not None:
        wanted = exact_requirements(vllm.get("requires_dist") or [])
        warnings += [f"warning: {CONSTRAINTS} pins {name}=={pins[name]} but vllm "
                     f"{vllm['version']} requires {name}=={version}"
                     for name, version in wanted.items() if pins.get(name, version) != version]
        shared = [f"{name}=={version}" for name, version in wanted.items() if name in pins]
        if shared:
            line += f"\ncheck-gpu-stack: vllm {vllm['version']} itself requires {', '.join(shared)}"
    return line, warnings


def _conflict_causes(lines: list[str]) -> list[str]:
    """The indented lines under pip's "The conflict is caused by:"."""
    if "The conflict is caused by:" not in lines:
        return []
    causes = []
    for line in lines[lines.index("The conflict is caused by:") + 1:]:
        if not line.strip():
            break
        causes.append(line.strip())
    return causes


def _only_request(causes: list[str]) -> str | None:
    """The requirement when every cause is the user's request of one and the same thing
    ("The user requested torch==2.13.0" and "... (constraint) torch==2.13.0"): pip found
    no installable release of it at all, which is no conflict between pins."""
    prefix = "The user requested "
    if not causes or not all(c.startswith(prefix) for c in causes):
        return None
    specs = {c[len(prefix):].removeprefix("(constraint) ").strip() for c in causes}
    return specs.pop() if len(specs) == 1 else None


def diagnose(output: str, where: str) -> tuple[int, str]:
    """(exit status, one line) for pip's output of a failed dry run; `where` names the
    Python and platform, e.g. "CPython 3.11 on Linux x86_64".

    An index that did not answer comes first: pip then reports the requirements it could
    not fetch as unsatisfiable, even as a "conflict"."""
    lines = output.splitlines()
    fix = f"fix the pins in {CONSTRAINTS} (or scripts/setup.sh)"
    if any(marker in output for marker in _NETWORK):
        return CANNOT_CHECK, ("error: cannot check here: the package index did not answer; "
                              "check the network (or pass --index-url) and run it again")
    if "ResolutionImpossible" in output:
        causes = _conflict_causes(lines)
        alone = _only_request(causes)
        if alone is not None:
            return CANNOT_CHECK, (f"error: cannot check here: no release of {alone} installable "
                                  f"on {where} (none is built for it, or the pin names none)")
        head = next((l for l in lines if "Cannot install" in l), "conflicting dependencies")
        why = "; ".join(causes) or head.removeprefix("ERROR: ").strip().rstrip(".")
        return CONFLICT, f"error: TARGET=gpu's requirements conflict: {why}; {fix}"
    missing = next((l for l in lines if "No matching distribution found for" in l), None)
    if missing is not None:
        req = missing.split("No matching distribution found for", 1)[1].strip()
        versions = next((l for l in lines if "Could not find a version" in l and req in l), "")
        available = versions.rpartition("(from versions:")[2].rstrip(")").strip()
        if available in ("", "none"):
            return CANNOT_CHECK, (f"error: cannot check here: no release of {req} installable "
                                  f"on {where} (none is built for it, or no such package)")
        tail = ", ".join(v.strip() for v in available.split(",")[-4:])
        return CONFLICT, f"error: no release matches {req} (the index has ... {tail}); {fix}"
    if "metadata-generation-failed" in output or "subprocess-exited-with-error" in output:
        pkg = next((l.strip() for l in reversed(lines) if l.startswith("Collecting ")), "a package")
        return CANNOT_CHECK, (f"error: cannot check here: a source distribution's metadata does "
                              f"not build on this machine ({pkg})")
    if "no such option" in output:
        return CANNOT_CHECK, ("error: cannot check here: this pip has no --dry-run/--report "
                              "(needs pip 22.2 or newer)")
    last = next((l for l in reversed(lines) if l.startswith("ERROR")), "no error line")
    return CANNOT_CHECK, f"error: cannot check here: pip failed: {last}"


def requirement_args() -> list[str]:
    """setup.sh's TARGET=gpu list, as pip arguments (one source for both)."""
    out = subprocess.run(["bash", "scripts/setup.sh", "--print-requirements"], cwd=ROOT,
                         env={**os.environ, "TARGET": "gpu"}, check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def resolve(args: list[str], index_url: str, tmp: Path) -> tuple[int, str, dict | None]:
    """(pip's exit status, its output, the report or None) of a dry run in a fresh venv."""
    venv.EnvBuilder(with_pip=True).create(tmp / "venv")
    python = tmp / "venv" / ("Scripts" if os.name == "nt" else "bin") / "python"
    report = tmp / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    cmd = [str(python), "-m", "pip", "--isolated", "--disable-pip-version-check", "--no-input",
           "install", "--dry-run", "--ignore-installed", "--progress-bar", "off",
           "--report", str(report), "--index-url", index_url, *args]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    output = done.stdout + done.stderr
    if done.returncode != 0 or not report.exists():
        return done.returncode or 1, output, None
    return 0, output, json.loads(report.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-url", default=PYPI, help=f"package index (default {PYPI})")
    opts = parser.parse_args(argv)
    args = requirement_args()
    where = f"{platform.python_implementation()} {sys.version_info[0]}.{sys.version_info[1]} " \
            f"on {platform.system()} {platform.machine()}"
    print(f"check-gpu-stack: resolving TARGET=gpu for {where} against {opts.index_url} "
          f"(pip --dry-run; a few minutes): {' '.join(args)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="rhymectl-gpu-check-") as tmp:
        try:
            _, output, report = resolve(args, opts.index_url, Path(tmp))
        except (OSError, subprocess.CalledProcessError) as err:
            print(f"error: cannot check here: no virtual environment with pip for "
                  f"{sys.executable}: {err}", file=sys.stderr)
            return CANNOT_CHECK
    if report is None:
        status, line = diagnose(output, where)
        print("\n".join(output.splitlines()[-15:]), file=sys.stderr)
        print(line, file=sys.stderr)
        return status
    line, warnings = summarize(report, read_pins((ROOT / CONSTRAINTS).read_text()))
    print(line)
    for warning in warnings:
        print(warning, file=sys.stderr)
    return OK


if __name__ == "__main__":
    sys.exit(main())
