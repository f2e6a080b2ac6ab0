"""The tables `rhymectl bench spec` prints (`cmd_bench_spec`): the methods, the critical
path and the GPU estimate, the oracle (`--ceiling`) and the gap closed, and the summary over
seeds (`--seeds`); `bench replay --ceiling` prints its gap closed with `render_gaps`."""

from __future__ import annotations

from rhymectl.output import out


def render_spec(result: dict) -> None:
    from rich.table import Table

    w = result["workload"]
    table = Table(title=f"{w['task']}: epochs {w['epochs_measured']}, {w['requests']} requests, "
                        f"{w['sequences_per_step']} sequences per step, T={w['temperature']}")
    if w.get("repeats", 1) > 1:
        table.caption = f"medians of {w['repeats']} interleaved repeats (min–max)"
    columns = ("method", "tau", "accept", "passes", "sched tokens", "rollout s", "tok/s",
               "speedup", "vs suffix", "floor s", "drafter", "identical")
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)

    def spread(m, key, fmt):
        if m.get(key) is None:
            return "–"
        text = fmt.format(m[key])
        if m.get("repeats", 1) > 1 and f"{key}_min" in m:
            text += f" ({fmt.format(m[key + '_min'])}–{fmt.format(m[key + '_max'])})"
        return text

    for name, m in result["methods"].items():
        same = {True: "yes", False: "NO", None: "–"}[m["identical"]]
        table.add_row(name, f"{m['tau']:.2f}", f"{m['accept_rate']:.0%}", str(int(m["passes"])),
                      str(int(m["scheduled_tokens"])), spread(m, "rollout_s", "{:.2f}"),
                      f"{m['tok_per_s']:.0f}", spread(m, "speedup", "{:.2f}×"),
                      spread(m, "vs_suffix", "{:.2f}×"), f"{m['floor_s']:.2f}",
                      f"{m['drafter_frac']:.1%}", same)
    out.print(table)
    render_critical_path(result)
    render_ceiling(result.get("ceiling"))
    for name, m in result["methods"].items():
        if m.get("draft_sources"):
            shares = ", ".join(f"{k} tree {v:.0%}" for k, v in m["draft_sources"].items())
            out.print(f"{name}: drafts served by the {shares}", markup=False)
    for name, m in result["methods"].items():
        if m.get("calibration"):
            cal = Table(title=f"{name}: calibration of per-token acceptance (tree path counts)")
            for column in ("tree q", "tokens tested", "predicted", "observed"):
                cal.add_column(column, justify="right")
            for row in m["calibration"]:
                cal.add_row(f"{row['lo']:.2f}–{row['hi']:.2f}", str(row["tried"]),
                            f"{row['predicted']:.3f}", f"{row['observed']:.3f}")
            out.print(cal)


def render_critical_path(result: dict) -> None:
    """Per method: target passes per step and on the critical path (medians over the
    measured steps), the tail's passes and taus, and the GPU estimate."""
    from rich.table import Table

    gpu = result.get("gpu_model")
    methods = result["methods"]
    if gpu is None or not any("critical_passes" in m for m in methods.values()):
        return
    table = Table(title="target passes per step (medians over steps); tail: fewer than a "
                        "quarter of the step's requests running")
    table.caption = (f"GPU est.: an estimate, not a measurement: each pass priced as on "
                     f"{gpu['name']}, max({gpu['weights_ms']:.2f} ms, scheduled tokens × "
                     f"{gpu['flops_per_token'] / gpu['peak_flops'] * 1e6:.1f} µs), plus "
                     f"{gpu.get('host_ms', 0):g} ms of host work after each pass of a "
                     f"speculating engine (no async scheduling) and {gpu.get('piecewise_ms', 0):g}"
                     f" / {gpu.get('eager_ms', 0):g} ms in passes without a full / any CUDA "
                     f"graph; × is none's estimate over the method's")
    # the total passes are in the table above; the tail's GPU seconds in --json
    for column in ("method", "passes/step", "critical", "tail", "crit. tau", "tail tau",
                   "GPU est. s", "GPU est. ×"):
        table.add_column(column, justify="right", no_wrap=True)

    def num(value, fmt):
        return "–" if value is None else fmt.format(value)

    for name, m in methods.items():
        table.add_row(name, num(m.get("passes_per_step"), "{:g}"),
                      num(m.get("critical_passes"), "{:g}"), num(m.get("tail_passes"), "{:g}"),
                      num(m.get("critical_tau"), "{:.2f}"), num(m.get("tail_tau"), "{:.2f}"),
                      num(m.get("gpu_estimate_s"), "{:.2f}"),
                      num(m.get("gpu_estimate_speedup"), "{:.2f}×"))
    out.print(table)


def render_ceiling(ceiling: dict | None) -> None:
    """The oracle's passes (`--ceiling`), one line per draft cap."""
    if not ceiling:
        return
    out.print(f"ceiling: a drafter that always drafted the policy's most likely token "
              f"({ceiling['argmax_share']:.0%} of none's sampled tokens were)", markup=False)
    for name, c in ceiling["caps"].items():
        ratio = f", {c['over_suffix']:.2f}× suffix's" if "over_suffix" in c else ""
        out.print(f"  {name}: {c['passes']} passes, critical path {c['critical_passes']:g} "
                  f"per step{ratio}", markup=False)
    render_gaps(ceiling.get("gap_closed"))
    if not ceiling["check"]:
        out.print("  (cap0 differs from none's measured critical path: a prefill split over "
                  "passes, or a response vLLM cut)", markup=False)


def render_gaps(gaps: dict | None) -> None:
    """One line per method: the share of history+group's gap to the oracle it closes
    (`pipeline.draft_ceiling.gaps_closed`; `bench spec --ceiling`, `bench replay --ceiling`)."""
    if not gaps or not gaps.get("methods"):
        return

    def share(value) -> str:
        return "–" if value is None else f"{value:.0%}"

    out.print(f"gap closed: the share of {gaps['reference']}'s passes over the oracle's (cap "
              f"{gaps['cap']}) that each method takes off", markup=False)
    for name, g in gaps["methods"].items():
        out.print(f"  {name}: {share(g['passes'])} of the total, {share(g['critical_passes'])} "
                  f"of the median step", markup=False)


def render_seeds(summary: dict) -> None:
    """The methods' passes over the seeds (`pipeline.bench.spec_seeds.across_seeds`)."""
    from rich.table import Table

    seeds = next(iter(summary.values()), {}).get("seeds", [])
    table = Table(title=f"over seeds {', '.join(map(str, seeds))}: medians (min–max); "
                        f"ratios to suffix taken within each seed")
    columns = [("passes", "passes", "{:g}"), ("passes_over_suffix", "× suffix", "{:.2f}"),
               ("critical_passes", "median step", "{:g}"),
               ("critical_over_suffix", "step × suffix", "{:.2f}")]
    if any("gap_passes" in m for m in summary.values()):
        columns += [("gap_passes", "gap closed", "{:.0%}"),
                    ("gap_critical", "step gap closed", "{:.0%}")]
    table.add_column("method")
    for _, head, _ in columns:
        table.add_column(head, justify="right", no_wrap=True)
    for name, m in summary.items():
        cells = []
        for key, _, fmt in columns:
            if m.get(key) is None:
                cells.append("–")
            else:
                cells.append(f"{fmt.format(m[key])} ({fmt.format(m[key + '_min'])}–"
                             f"{fmt.format(m[key + '_max'])})")
        table.add_row(name, *cells)
    out.print(table)


__all__ = ["render_ceiling", "render_critical_path", "render_gaps", "render_seeds", "render_spec"]
