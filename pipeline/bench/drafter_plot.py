"""`bench drafter`'s figure: per-pass proposer time against live requests, and tau."""

from __future__ import annotations

from pathlib import Path

from pipeline.atomic import write_atomic

COLORS = {"ours": "#4c72b0", "ours-inline": "#8172b3", "suffix": "#dd8452",
          "floor": "#55a868", "model": "#c44e52"}
LABELS = {"ours": "rhymectl drafter", "ours-inline": "rhymectl drafter, background inline",
          "suffix": "vLLM suffix", "floor": "one bare tree query per row (floor)",
          "model": "draft model, every row (--model)"}


def write_drafter_plot(report: dict, path: str | Path) -> Path:
    """Left: every timed pass (ms against the rows it had, faint) and, per --live value,
    the median with a bar up to the p99 (dashed: the proposer thread's CPU time). Right:
    tau per lane and --live value (the model lane's tau: random weights). With a model lane
    the time axis is logarithmic."""
    from matplotlib.figure import Figure

    lanes = report["workload"]["lanes"]
    points = report["points"]
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax, ax_tau = fig.subplots(1, 2, width_ratios=(2, 1))
    for name in lanes:
        color = COLORS.get(name, "gray")
        for pt in points:
            side = pt[name]
            ax.scatter(side["rows"], side["ms"], s=4, alpha=0.15, color=color, linewidths=0)
        xs = [pt["live"] for pt in points]
        med = [pt[name]["per_pass_ms"]["median"] for pt in points]
        p99 = [pt[name]["per_pass_ms"]["p99"] for pt in points]
        ax.errorbar(xs, med, yerr=[[0] * len(med), [b - a for a, b in zip(med, p99)]],
                    color=color, marker="o", capsize=4, label=f"{LABELS.get(name, name)} "
                    f"(median, bar to p99)")
        ax.plot(xs, [pt[name]["per_pass_cpu_ms"]["median"] for pt in points], color=color,
                ls="--", marker=".", label=f"{LABELS.get(name, name)}, CPU time (median)")
        ax_tau.plot(xs, [pt[name]["tau"] for pt in points], color=color, marker="o",
                    label=LABELS.get(name, name))
    w = report["workload"]
    ax.set(xlabel="live requests (rows in the pass)", ylabel="ms in the proposer per pass",
           title=f"per-pass drafter time, {w['mean_len']}-token responses, vocab {w['vocab']}")
    if "model" in lanes:  # a draft model's forward is 100-1000x a tree query: log scale
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax_tau.set(xlabel="live requests", ylabel="tokens per pass and sequence (tau)",
               title=f"tau at rhyme {w['rhyme']}")
    ax_tau.set_ylim(bottom=1.0)
    ax_tau.legend(fontsize=8)
    load = report["machine"]["loadavg_before"][0]
    fig.suptitle(f"rhymectl bench drafter: {report['machine']['cpus']} CPUs, load {load}, "
                 f"{w['repeats']} repeats x {w['passes']} passes, GPU pass {w['gpu_ms']} ms")
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))


__all__ = ["write_drafter_plot"]
