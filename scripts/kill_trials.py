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

import run_audit as audit  # noqa: E402  (next to this script)

# Small enough for a shared 2-core box; any of it can be overridden on the command line.
SMALL = ["data.train_batch_size=2", "train.ppo_mini_batch_size=2", "rollout.n=2",
         "rollout.max_tokens=32", "data.max_prompt_length=24", "data.eval_size=4",
         "train.total_steps=6", "run.checkpoint_every=2", "run.eval_every=2"]


def start(model: Path, run_dir: Path, extra: list[str], resume: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rhymectl", "train", str(REPO / "sample_configs/tiny.yaml"),
           f"model.path={model}", f"run.dir={run_dir}", *SMALL, *extra] + ["--resume"] * resume
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = open(run_dir.parent / f"{run_dir.name}.log", "a")  # a pipe could fill and block it
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log,
                            start_new_session=True)


def last_error(run_dir: Path) -> list[str]:
    lines = (run_dir.parent / f"{run_dir.name}.log").read_text().strip().splitlines()
    return [line for line in lines if line.startswith("error:")][-1:] or lines[-1:]


def trial(model: Path, run_dir: Path, extra: list[str], rng: random.Random, lo: float,
          hi: float, max_kills: int) -> dict:
    kills, starts, resume = 0, 0, False
    while True:
        began = time.time()
        proc = start(model, run_dir, extra, resume)
        starts += 1
        deadline = time.time() + rng.uniform(lo, hi) if kills < max_kills else None
        while proc.poll() is None and (deadline is None or time.time() < deadline):
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            resume = True
            continue
        if proc.returncode != 0:
            return {"kills": kills, "starts": starts, "error": last_error(run_dir)}
        done = {"kills": kills, "starts": starts}
        if deadline is not None:  # finished before its kill came
            done["unkilled_s"] = round(time.time() - began, 1)
        return done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--kills", type=int, default=3, help="most kills per trial")
    ap.add_argument("--min-s", type=float, default=3.0, help="earliest kill, seconds after start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/kill-trials"))
    ap.add_argument("--reference", type=Path, default=None,
                    help="an uninterrupted run of the same settings to reuse (else one is run)")
    ap.add_argument("--window", type=float, default=None,
                    help="latest kill, seconds after start [the reference's wall time]")
    ap.add_argument("overrides", nargs="*", help="key=value for every run")
    args = ap.parse_args()
    extra = list(args.overrides)
    if not any(o.startswith("spec.method=") for o in extra):
        extra.append("spec.method=none")
    exact = "spec.method=none" in extra
    shutil.rmtree(args.out, ignore_errors=True)
    ref_dir = args.reference or args.out / "reference"
    ref_s = args.window
    if args.reference is None:
        t0 = time.time()
        proc = start(args.model.resolve(), ref_dir, extra, resume=False)
        if proc.wait() != 0:
            print(f"reference run failed: {last_error(ref_dir)}", file=sys.stderr)
            return 1
        ref_s = ref_s or time.time() - t0
    reference = audit.snapshot(ref_dir)
    rng = random.Random(args.seed)
    rows, total_lost = [], 0
    print(f"kills drawn from U[{args.min_s:.0f}, {ref_s:.0f}] s after each start; "
          f"compare {'bit for bit' if exact else 'for completeness'}", flush=True)
    print("trial | kills | starts | history lost/dup/extra/differ | metrics | eval | status")
    for n in range(args.trials):
        run_dir = args.out / f"trial-{n:02d}"
        result = trial(args.model.resolve(), run_dir, extra, rng, args.min_s, ref_s, args.kills)
        if result.get("unkilled_s"):  # the machine got faster: kill within the run's length
            ref_s = max(args.min_s + 1, 0.9 * result["unkilled_s"])
        report = audit.compare(reference, audit.snapshot(run_dir), exact=exact)
        if not exact:
            for part in report.values():  # contents differ by design: count rows only
                part.pop("differ", None)
        lost = audit.problems(report)
        total_lost += lost
        cells = ["/".join(str(v) for v in report[k].values()) for k in ("history", "metrics", "eval")]
        status = "ok" if lost == 0 and "error" not in result else result.get("error", "rows differ")
        if result.get("unkilled_s"):
            status += f" (last start outran its kill; window now {ref_s:.0f} s)"
        print(f"{n:5d} | {result['kills']:5d} | {result['starts']:6d} | {cells[0]:>29} | "
              f"{cells[1]:>7} | {cells[2]:>4} | {status}", flush=True)
        rows.append({"trial": n, **result, **{k: report[k] for k in report}})
        (args.out / "trials.json").write_text(json.dumps(rows, indent=1))  # kept if stopped
        shutil.rmtree(run_dir, ignore_errors=True)
        (args.out / f"{run_dir.name}.log").unlink(missing_ok=True)
    kills = sum(r["kills"] for r in rows)
    print(f"total: {len(rows)} trials, {kills} kills, {total_lost} rows lost, duplicated or "
          f"different")
    (args.out / "trials.json").write_text(json.dumps(rows, indent=1))
    return 0 if total_lost == 0 and all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
