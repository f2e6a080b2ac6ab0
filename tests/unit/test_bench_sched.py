"""`rhymectl bench sched`: the JSON contract, the table, the Gantt chart, every error path."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from pipeline.history.store import HistoryStore, RolloutRecord
from pipeline.bench.figures import occupancy
from pipeline.bench.sched import BenchSetup, bench_json, run_bench
from pipeline.sched.trace import read_trace
from rhymectl import cmd_bench
from rhymectl.parsing import parse_policies

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
METRICS = {"makespan_s", "ideal_s", "makespan_over_ideal", "over_oracle", "bubble_ratio", "tail_s"}


def cli() -> typer.Typer:
    app = typer.Typer()
    cmd_bench.register(app)
    app.command("noop", hidden=True)(lambda: None)  # two entries: keep "bench" a subcommand
    return app


def main(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """Through rhymectl.app.main, for its exit codes and error lines."""
    import rhymectl.app

    monkeypatch.setattr(rhymectl.app, "app", cli())
    with pytest.raises(SystemExit) as exc:
        rhymectl.app.main(list(args))
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err


@pytest.fixture
def run_dir(tmp_path):
    """Two epochs of 8 prompts x 4 responses; prompt i answers about 10 * (i + 1) tokens."""
    store = HistoryStore(tmp_path / "run")
    for epoch in range(2):
        records = [RolloutRecord(f"p{i}", "h", epoch, epoch, epoch, s, [], 10 * (i + 1) + s + epoch,
                                 "stop", 0.0, 0.1) for i in range(8) for s in range(4)]
        store.append(epoch, records)
    return tmp_path / "run"


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("group,length\n" + "".join(f"g{i % 5},{7 * i % 40 + 1}\n" for i in range(20)))
    return path


def test_json_has_exactly_the_documented_shape(run_dir, monkeypatch, capsys):
    code, out, err = main(monkeypatch, capsys, "bench", "sched", str(run_dir), "--workers", "4",
                          "--simulate", "--json", "--requests-per-worker", "8")
    assert code == 0, err
    obj = json.loads(out)
    assert set(obj) == {"source", "workers", "policies"}
    assert obj["source"] == "simulated" and obj["workers"] == 4
    assert list(obj["policies"]) == ["static", "histopipe", "seer", "oracle"]
    for values in obj["policies"].values():
        assert set(values) == METRICS
        assert values["makespan_s"] >= values["ideal_s"] > 0
        assert values["makespan_over_ideal"] == pytest.approx(values["makespan_s"] / values["ideal_s"], rel=1e-4)
    png = run_dir / "report" / "bench-sched-w4.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert err == f"Gantt chart: {png}\n"


def test_table_and_plot_for_a_trace_file(trace_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = main(monkeypatch, capsys, "bench", "sched", "--trace", str(trace_file),
                          "--policies", "static,seer", "--workers", "2", "--simulate",
                          "--spec", "history+group")
    assert code == 0, err
    assert "static" in out and "seer" in out and "histopipe" not in out and "× ideal" in out
    assert (tmp_path / "bench-sched-lengths-w2.png").read_bytes()[:8] == PNG_SIGNATURE


def test_explicit_plot_path(trace_file, tmp_path):
    plot = tmp_path / "out" / "g.png"
    result = CliRunner().invoke(cli(), ["bench", "sched", "--trace", str(trace_file), "--workers", "3",
                                        "--simulate", "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    assert plot.read_bytes()[:8] == PNG_SIGNATURE
    assert not [p for p in plot.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("args, expected", [
    (["--policies", "static,fifo"], "unknown placement policy 'fifo' in --policies; choose from "
                                    "static, histopipe, tier2, seer, oracle"),
    (["--policies", ","], "no placement policy given in --policies; choose from static, histopipe, "
                          "tier2, seer, oracle"),
    (["--spec", "ngram"], "--spec 'ngram' is not simulated; choose from none, history+group"),
    (["--no-source"], "give a RUN_DIR or --trace FILE"),
    (["--both"], "give either RUN_DIR or --trace FILE, not both"),
    (["--no-simulate"], "a --trace holds lengths, not prompts: replay it with --simulate, or give "
                        "a RUN_DIR to measure real rollout workers"),
    (["--workers", "100"], "--workers 100 is larger than the 20 requests of {trace} (epoch 0); give "
                           "at most 20 workers"),
])
def test_usage_errors_exit_2_with_one_line(trace_file, monkeypatch, capsys, args, expected):
    source = ["--trace", str(trace_file)]
    if "--no-source" in args:
        source, args = [], []
    elif "--both" in args:
        source, args = [str(trace_file.parent)] + source, []
    simulate = [] if "--no-simulate" in args else ["--simulate"]
    args = [a for a in args if a != "--no-simulate"]
    code, out, err = main(monkeypatch, capsys, "bench", "sched", *source, *simulate, *args)
    assert (code, out) == (2, "")
    assert err == f"error: {expected.format(trace=trace_file)}\n"


def test_run_dir_without_history_exits_2(tmp_path, monkeypatch, capsys):
    code, _, err = main(monkeypatch, capsys, "bench", "sched", str(tmp_path), "--simulate")
    assert code == 2
    assert err == (f"error: {tmp_path} has no history ({tmp_path / 'history'}/step-*.parquet); train at "
                   f"least one step there, or pass --trace FILE\n")


def test_bad_option_values_exit_2(trace_file, monkeypatch, capsys):
    code, _, err = main(monkeypatch, capsys, "bench", "sched", "--trace", str(trace_file), "--workers", "0",
                        "--simulate")
    assert code == 2 and "Invalid value for '--workers'" in err


@pytest.mark.parametrize("path", [["bench"], ["bench", "sched"]])
def test_help_has_an_example(path):
    result = CliRunner().invoke(cli(), [*path, "--help"])
    assert result.exit_code == 0 and "Example: rhymectl bench" in result.stdout


def test_run_bench_is_deterministic_and_spec_shortens_the_tail(run_dir):
    from pipeline.sched.trace import trace_from_history

    trace = trace_from_history(run_dir)
    setup = BenchSetup(policies=("static", "seer"), workers=4, requests_per_worker=16)
    first, again = run_bench(trace, setup), run_bench(trace, setup)
    assert bench_json(first, 4) == bench_json(again, 4)
    spec = run_bench(trace, BenchSetup(policies=("seer",), workers=4, requests_per_worker=16,
                                       spec="history+group"))
    assert spec["seer"].tail_s < first["seer"].tail_s


def test_parse_policies_keeps_order_and_drops_repeats():
    assert parse_policies(" seer, static,seer ") == ("seer", "static")


def test_occupancy_averages_running_requests_per_bin():
    import numpy as np

    line = [(0.0, 1.0, 4), (1.0, 2.0, 2), (3.0, 4.0, 1)]
    got = occupancy(line, np.array([0.0, 0.5, 1.5, 2.5, 4.0]))
    assert got == pytest.approx([4.0, 3.0, 1.0, 2 / 3])  # [2.5, 4): 1 s of 1 over 1.5 s
    assert occupancy([], np.array([0.0, 1.0])).tolist() == [0.0]


def test_trace_file_requests_bound_the_workers(trace_file):
    assert read_trace(trace_file).requests == 20


def test_tier2_options_reach_the_placement(run_dir, monkeypatch, capsys):
    base = ["bench", "sched", str(run_dir), "--simulate", "--workers", "4", "--policies",
            "histopipe,tier2", "--requests-per-worker", "8", "--json"]
    code, out, _ = main(monkeypatch, capsys, *base, "--tier2-workers-frac", "0")
    assert code == 0
    off = json.loads(out)["policies"]
    assert off["tier2"]["makespan_s"] == off["histopipe"]["makespan_s"]  # no reserved worker
    code, out, _ = main(monkeypatch, capsys, *base, "--tier2-workers-frac", "0.5",
                        "--tier2-max-seqs", "2")
    assert code == 0
    assert json.loads(out)["policies"]["tier2"]["makespan_s"] != off["tier2"]["makespan_s"]


def test_policies_in_parallel_processes_give_the_same_results(run_dir):
    from pipeline.sched.trace import trace_from_history

    trace = trace_from_history(run_dir)
    policies = ("static", "histopipe", "tier2", "seer", "oracle")
    one = run_bench(trace, BenchSetup(policies=policies, workers=4, requests_per_worker=16, jobs=1))
    two = run_bench(trace, BenchSetup(policies=policies, workers=4, requests_per_worker=16, jobs=2))
    assert list(two) == list(policies)  # the order asked for, not the order they finished
    for name in policies:
        assert two[name].finish_s == one[name].finish_s, name
        assert two[name].timelines == one[name].timelines, name
        assert two[name].summary() == one[name].summary(), name


def test_negative_jobs_exit_2(trace_file, monkeypatch, capsys):
    code, _, err = main(monkeypatch, capsys, "bench", "sched", "--trace", str(trace_file), "--simulate",
                        "--jobs", "-1")
    assert code == 2 and "Invalid value for '--jobs'" in err


def test_policies_run_in_spawned_processes_while_other_threads_run(run_dir, monkeypatch):
    """With another thread alive, forking is unsafe: the policies run in spawned
    processes instead, with the same results."""
    import multiprocessing
    import threading

    from pipeline.bench import sched
    from pipeline.sched.trace import trace_from_history

    methods = []
    real = multiprocessing.get_context
    monkeypatch.setattr(sched.multiprocessing, "get_context",
                        lambda method: methods.append(method) or real(method))

    trace = trace_from_history(run_dir)
    setup = BenchSetup(policies=("static", "seer"), workers=4, requests_per_worker=16, jobs=1)
    one = run_bench(trace, setup)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        two = run_bench(trace, BenchSetup(policies=("static", "seer"), workers=4,
                                          requests_per_worker=16, jobs=2))
    finally:
        stop.set()
        other.join()
    assert methods == ["spawn"]
    assert bench_json(two, 4) == bench_json(one, 4)


def test_simulation_progress_draws_on_a_terminal_only_and_starts_no_thread(monkeypatch):
    """The bar redraws only when a policy ends: no refresh thread, so `--jobs` may fork."""
    import io
    import threading

    from rich.console import Console

    buf = io.StringIO()
    monkeypatch.setattr(cmd_bench, "log", Console(file=buf, force_terminal=True, width=80))
    threads = threading.active_count()  # other tests may have left threads behind
    with cmd_bench._simulating(2) as advance:
        assert threading.active_count() == threads
        advance("static")
        advance("seer")
    assert "2/2" in buf.getvalue()
    quiet = io.StringIO()
    monkeypatch.setattr(cmd_bench, "log", Console(file=quiet, force_terminal=False))
    with cmd_bench._simulating(2) as advance:
        advance("static")
    assert quiet.getvalue() == ""
