"""Soak: a long `rhymectl train` of the tiny config with history+group drafting, watching
resident memory and step time.

    python scripts/soak.py --model models/tiny-sort --steps 500 [--out runs/soak] [key=value ...]

Samples the training process's RSS (with its children) once a second, maps samples to the
step being run (metrics.jsonl), and prints: RSS growth per 100 steps after warm-up (a
least-squares slope over the per-step RSS after the first --warmup steps), the step-time
slope (seconds per step, per 100 steps), and the history index's size against its bound
(spec.history_epochs epochs per prompt). Writes OUT/soak.json and OUT/soak.png (RSS and
step time over steps). Exit 1 if the run fails. `--minutes M` stops the run after M minutes and reports the steps
that ran (a busy machine cannot always give a soak its 500 steps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Small steps so that a shared 2-core box gets through many: 8 steps per epoch, so history
# drafting and the index's last-K-epochs bound are exercised from step 9 on.
TINY = ["data.train_batch_size=4", "train.ppo_mini_batch_size=4", "rollout.n=4",
        "rollout.max_tokens=48", "data.train_size=32", "data.eval_size=16",
        "spec.method=history+group", "run.checkpoint_every=50", "run.eval_every=100"]


def rss_bytes(pid: int) -> int:
    import psutil

    try:
        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
    except psutil.Error:
        return 0


def slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else float("nan")


def plot(per_step: list[dict], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    steps = [r["step"] for r in per_step]
    top.plot(steps, [r["rss_mib"] for r in per_step])
    top.set_ylabel("RSS (MiB)")
    bottom.plot(steps, [r["step_s"] for r in per_step])
    bottom.set_ylabel("step time (s)")
    bottom.set_xlabel("step")
    fig.suptitle("soak: tiny config, history+group")
    fig.savefig(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=20, help="steps left out of the fits")
    ap.add_argument("--out", type=Path, default=Path("runs/soak"))
    ap.add_argument("--minutes", type=float, default=None,
                    help="stop the run after this long and report the steps it got through")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    run_dir = args.out / "run"
    cmd = [sys.executable, "-m", "rhymectl", "train", str(REPO / "sample_configs/tiny.yaml"),
           f"model.path={args.model.resolve()}", f"run.dir={run_dir}", *TINY,
           f"train.total_steps={args.steps}", *args.overrides, "--force"]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    args.out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(args.out / "train.log", "w"))
    samples = []  # (seconds, steps done, rss bytes)
    metrics = run_dir / "metrics.jsonl"
    started = time.time()
    stopped = False
    while proc.poll() is None:
        done = metrics.read_text().count("\n") if metrics.exists() else 0
        samples.append((round(time.time() - started, 1), done, rss_bytes(proc.pid)))
        if args.minutes is not None and time.time() - started > 60 * args.minutes:
            proc.kill()  # out of time: what ran is still measured
            proc.wait()
            stopped = True
            break
        time.sleep(1.0)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    # per step: the last RSS sample taken while that step was the latest finished one
    rss_at = {}
    for _, done, rss in samples:
        if done and rss:
            rss_at[done] = rss
    per_step = [{"step": r["step"], "step_s": r.get("time_step_s", 0.0),
                 "rss_mib": round(rss_at[r["step"]] / 2**20, 1)}
                for r in rows if r["step"] in rss_at]
    fit = [r for r in per_step if r["step"] > args.warmup]
    summary = {
        "steps_run": len(rows), "steps_asked": args.steps,
        "exit": "stopped at --minutes" if stopped else proc.returncode,
        "wall_s": round(time.time() - started, 1), "warmup_steps": args.warmup,
        "rss_mib_first_after_warmup": fit[0]["rss_mib"] if fit else None,
        "rss_mib_last": per_step[-1]["rss_mib"] if per_step else None,
        "rss_growth_mib_per_100_steps": round(100 * slope([r["step"] for r in fit],
                                                          [r["rss_mib"] for r in fit]), 2),
        "step_time_s_mean": round(sum(r["step_s"] for r in fit) / len(fit), 3) if fit else None,
        "step_time_drift_s_per_100_steps": round(100 * slope([r["step"] for r in fit],
                                                             [r["step_s"] for r in fit]), 3),
    }
    meta = run_dir / "index" / "meta.json"
    if meta.exists():
        from pipeline.config import load_config

        m = json.loads(meta.read_text())
        cfg = load_config(run_dir / "config.yaml")
        bound = cfg.data.train_size * cfg.spec.history_epochs * cfg.rollout.n
        summary["index"] = {"rows": m["rows"], "tokens": m["tokens"],
                            "history_epochs": m["history_epochs"], "rows_bound": bound,
                            "within_bound": m["rows"] <= bound}
        last = rows[-1] if rows else {}
        summary["spec_tau_last"] = last.get("spec_tau")
    (args.out / "soak.json").write_text(json.dumps({"summary": summary, "per_step": per_step,
                                                    "samples": samples}, indent=1))
    if per_step:
        plot(per_step, args.out / "soak.png")
    print(json.dumps(summary, indent=1))
    return 0 if proc.returncode == 0 or stopped else 1


if __name__ == "__main__":
    sys.exit(main())
