"""Random-kill trials: SIGKILL a real `rhymectl train` at random moments, resume, and count
the rows lost against an uninterrupted run.

    python scripts/kill_trials.py --model models/tiny-sort --trials 20 [--out DIR]

One uninterrupted reference run first (spec.method=none, so a resumed run must match it
bit for bit), then per trial: start the run in its own process group, kill the whole group
with SIGKILL after a time drawn uniformly from [--min-s, the reference's wall time], resume
with --resume, and repeat up to --kills times before letting it finish. Prints one table
row per trial (kills, history/metrics/eval rows lost, duplicated, different) and a total.
Extra `key=value` arguments go to every run (e.g. spec.method=history+group; then rows are
counted for completeness, not compared for contents).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.loop import audit  # noqa: E402

# Small enough for a shared 2-core box; any of it can be overridden on the command line.
SMALL = ["data.train_batch_size=2", "train.ppo_mini_batch_size=2", "rollout.n=2",
         "rollout.max_tokens=32", "data.max_prompt_length=24", "data.eval_size=4",
         "train.total_steps=6", "run.checkpoint_every=2", "run.eval_every=2"]


def start(model: Path, run_dir: Path, extra: list[str], resume: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rhymectl", "train", str(REPO / "sample_configs/tiny.yaml"),
           f"model.path={model}", f"run.dir={run_dir}", *SMALL, *extra] + ["--resume"] * resume
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def trial(model: Path, run_dir: Path, extra: list[str], rng: random.Random, lo: float,
          hi: float, max_kills: int) -> dict:
    kills, starts, resume = 0, 0, False
    while True:
        proc = start(model, run_dir, extra, resume)
        starts += 1
        deadline = time.time() + rng.uniform(lo, hi) if kills < max_kills else None
        while proc.poll() is None and (deadline is None or time.time() < deadline):
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stderr.close()
            kills += 1
            resume = True
            continue
        err = proc.stderr.read()
        proc.stderr.close()
        if proc.returncode != 0:
            return {"kills": kills, "starts": starts, "error": err.strip().splitlines()[-1:]}
        return {"kills": kills, "starts": starts}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--kills", type=int, default=3, help="most kills per trial")
    ap.add_argument("--min-s", type=float, default=3.0, help="earliest kill, seconds after start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/kill-trials"))
    ap.add_argument("overrides", nargs="*", help="key=value for every run")
    args = ap.parse_args()
    extra = list(args.overrides)
    if not any(o.startswith("spec.method=") for o in extra):
        extra.append("spec.method=none")
    exact = "spec.method=none" in extra
    shutil.rmtree(args.out, ignore_errors=True)
    ref_dir = args.out / "reference"
    t0 = time.time()
    proc = start(args.model.resolve(), ref_dir, extra, resume=False)
    err = proc.stderr.read()
    if proc.wait() != 0:
        print(f"reference run failed: {err.strip().splitlines()[-1:]}", file=sys.stderr)
        return 1
    ref_s = time.time() - t0
    reference = audit.snapshot(ref_dir)
    rng = random.Random(args.seed)
    rows, total_lost = [], 0
    print(f"reference: {ref_s:.0f} s; kills drawn from U[{args.min_s:.0f}, {ref_s:.0f}] s; "
          f"compare {'bit for bit' if exact else 'for completeness'}", flush=True)
    print("trial | kills | starts | history lost/dup/extra/differ | metrics | eval | status")
    for n in range(args.trials):
        run_dir = args.out / f"trial-{n:02d}"
        result = trial(args.model.resolve(), run_dir, extra, rng, args.min_s, ref_s, args.kills)
        report = audit.compare(reference, audit.snapshot(run_dir), exact=exact)
        if not exact:
            for part in report.values():  # contents differ by design: count rows only
                part.pop("differ", None)
        lost = audit.problems(report)
        total_lost += lost
        cells = ["/".join(str(v) for v in report[k].values()) for k in ("history", "metrics", "eval")]
        status = "ok" if lost == 0 and "error" not in result else result.get("error", "rows differ")
        print(f"{n:5d} | {result['kills']:5d} | {result['starts']:6d} | {cells[0]:>29} | "
              f"{cells[1]:>7} | {cells[2]:>4} | {status}", flush=True)
        rows.append({"trial": n, **result, **{k: report[k] for k in report}})
        (args.out / "trials.json").write_text(json.dumps(rows, indent=1))  # kept if stopped
        shutil.rmtree(run_dir, ignore_errors=True)
    kills = sum(r["kills"] for r in rows)
    print(f"total: {len(rows)} trials, {kills} kills, {total_lost} rows lost, duplicated or "
          f"different")
    (args.out / "trials.json").write_text(json.dumps(rows, indent=1))
    return 0 if total_lost == 0 and all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
