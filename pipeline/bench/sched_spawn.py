"""Start `pipeline.bench.sched_real` on W torchrun ranks and read back what rank 0 wrote."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pipeline import children
from pipeline.errors import RuntimeFailure
from pipeline.loop.launch import torchrun_command, torchrun_env
from pipeline.sched.simulator import SimResult


def run_real(run_dir: Path, setup) -> tuple[dict, dict]:
    """({policy: SimResult-shaped result}, {"policies": {name: extra}, "cost_model": ..})."""

    # this process's own file: two benches on one run directory never read each other's
    out = Path(run_dir) / "report" / f".bench-sched-real-{os.getpid()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    knobs = setup.settings
    args = [str(run_dir), str(out), ",".join(setup.policies), setup.spec,
            str(setup.requests_per_worker), str(knobs.chunk_tokens), str(setup.capacity),
            str(setup.seed), str(knobs.tier2_workers_frac), str(knobs.tier2_max_seqs),
            str(knobs.migrate_gap or 0)] + (
                [] if setup.epoch is None else [str(setup.epoch)])
    cmd = torchrun_command(setup.workers, "pipeline.bench.sched_real", *args)
    code = children.run(cmd, env=torchrun_env(), stdout=sys.stderr)  # stdout: the --json object
    if code or not out.is_file():
        raise RuntimeFailure(f"bench sched on {setup.workers} real workers failed (exit {code})")
    report = json.loads(out.read_text())
    out.unlink()
    results, extra = {}, {"policies": {}, "cost_model": report["cost_model"]}
    for name in (n for n in setup.policies if n in report["policies"]):
        p = report["policies"][name]
        timelines = [[tuple(seg) for seg in line] for line in p.pop("timelines")]
        results[name] = SimResult(name, report["workers"], p["makespan_s"], p["ideal_s"],
                                  p["bubble_ratio"], p["tail_s"], p["migrations"], [], timelines)
        extra["policies"][name] = {k: p[k] for k in ("migrations", "simulated_makespan_s",
                                                     "sim_over_real")}
    return results, extra


__all__ = ["run_real"]
