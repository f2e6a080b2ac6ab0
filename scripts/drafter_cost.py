"""What rhymectl's drafter costs per target forward pass, without vLLM.

A synthetic rollout drives `RhymeProposer.propose` the way vLLM's model runner does: a
stand-in input batch (`req_ids`, `num_prompt_tokens`, `req_id_to_index`, int32
`token_ids_cpu` and `num_tokens_no_spec`, rows condensed as vLLM condenses them), the real
`attach` binding, `GroupDrafter` and `DraftBudget`. Each RL step runs G prompts x n
samples; every prompt has a planned "true" response per request, similar within the
group and to the prompt's H earlier responses (handed over with `set_history`). A row
emits one token plus the drafted tokens that match its planned response, so the output is
what the target would produce whatever is drafted, and requests finish at different
lengths: the batch thins into a tail. The planned responses use a char-like vocabulary,
a format shared across prompts (header, separators, footer) and pieces copied from the
prompt, then mutated (substitutions, insertions, deletions).

Every step revisits the same prompts (one epoch each), so from the second step on the
prompt trees exist and the history window holds the previous step's responses, as in a
training run (`--fresh-prompts`: new prompts every step, their trees built mid-rollout).
The budget is `pipeline.drafting.build.budget_config`'s with this machine's pass cost.

The simulation is deterministic for a seed, so it is repeated and each pass's time is the
fastest of its repeats (the machine may be busy). Reported: microseconds per `propose`
call overall, in full-batch passes (> 200 rows), in tail passes (< 32 rows); the drafter's
share of the rollout time, taking a pass to cost base + per_token x scheduled tokens; and
a cProfile breakdown of one more repeat, by component and by function.

    .venv/bin/python scripts/drafter_cost.py                      # history+group
    .venv/bin/python scripts/drafter_cost.py --method group
    .venv/bin/python scripts/drafter_cost.py --dump drafts.json   # every pass's drafts
    PYTHONPATH=/other/checkout .venv/bin/python scripts/drafter_cost.py   # other code
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))  # PYTHONPATH may point elsewhere

from pipeline.history.store import prompt_hash  # noqa: E402
from pipeline.rollout.proposer import RhymeProposer, attach  # noqa: E402
from pipeline.costs import CostModel  # noqa: E402
from pipeline.drafting.budget import BudgetConfig, DraftBudget, TreeBudget  # noqa: E402
from pipeline.drafting.critical import CriticalBudget, CriticalConfig  # noqa: E402
from pipeline.drafting.drafter import GroupDrafter  # noqa: E402
from pipeline.config.schema import SpecConfig  # noqa: E402
from pipeline.drafting.build import drafter_config  # noqa: E402
from pipeline.drafting.inputs import HistoryResponse  # noqa: E402

FULL_ROWS = 200  # passes with more rows count as full-batch passes
TAIL_ROWS = 32  # passes with fewer rows count as tail passes


# ------------------------------------------------------------------ planned responses

@dataclass
class Workload:
    """The prompts of a run, their planned responses and their history window."""

    prompts: list[list[int]]
    bases: list[list[int]]  # per prompt, the response the policy tends to give
    history: list[list[list[int]]]  # per prompt, the H latest earlier responses


def _mutate(rng: random.Random, seq: list[int], rate: float, vocab: int) -> list[int]:
    out = []
    for t in seq:
        u = rng.random()
        if u < rate:  # substitution
            out.append(rng.randrange(1, vocab))
        elif u < 1.5 * rate:  # deletion
            continue
        elif u < 2.0 * rate:  # insertion
            out.extend((t, rng.randrange(1, vocab)))
        else:
            out.append(t)
    return out


def _template(rng: random.Random, prompt: list[int], length: int, vocab: int) -> list[int]:
    header, sep, footer = [1, 2, 3, 4, 5, 6], [7, 8], [9, 10, 11, 12]  # shared format
    body: list[int] = []
    while len(body) < length - len(header) - len(footer):
        if rng.random() < 0.6:  # a piece copied from the prompt
            a = rng.randrange(0, len(prompt) - 4)
            body += prompt[a:a + rng.randint(4, 8)]
        else:
            body += [rng.randrange(13, vocab) for _ in range(rng.randint(3, 8))]
        body += sep
    return header + body[: length - len(header) - len(footer)] + footer


def _lengths(rng: random.Random) -> float:
    return rng.uniform(0.8, 1.15)  # responses end earlier or later than the template


def make_workload(rng: random.Random, groups: int, history: int, prompt_len: int, vocab: int,
                  min_len: int, max_len: int) -> Workload:
    prompts, bases, hist = [], [], []
    for _ in range(groups):
        prompt = [rng.randrange(13, vocab) for _ in range(prompt_len - 1)] + [vocab]
        base = _template(rng, prompt, rng.randint(min_len, max_len), vocab)
        prompts.append(prompt)
        bases.append(base)
        hist.append([_mutate(rng, base, 0.03, vocab)[: int(len(base) * _lengths(rng))] or [1]
                     for _ in range(history)])
    return Workload(prompts, bases, hist)


def plan_step(rng: random.Random, work: Workload, n: int, vocab: int,
              max_response: int) -> list[list[list[int]]]:
    """Per prompt, this step's n planned responses: the group drifts a little from the
    prompt's usual response, each sample a little from the group."""
    out = []
    for base in work.bases:
        group = _mutate(rng, base, 0.02, vocab)
        out.append([(_mutate(rng, group, 0.02, vocab)[: int(len(group) * _lengths(rng))]
                     or [1])[:max_response] for _ in range(n)])
    return out


# ------------------------------------------------------------------ vLLM stand-ins

class FakeInputBatch:
    """What the proposer reads of vLLM's InputBatch, with vLLM's row condensing."""

    def __init__(self, max_reqs: int, max_model_len: int):
        self.req_ids: list = []
        self.req_id_to_index: dict = {}
        self.num_prompt_tokens = np.zeros(max_reqs, dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(max_reqs, dtype=np.int32)
        self.token_ids_cpu = np.zeros((max_reqs, max_model_len), dtype=np.int32)

    def add(self, req_id, prompt: list[int]) -> None:
        i = len(self.req_ids)
        self.req_ids.append(req_id)
        self.req_id_to_index[req_id] = i
        self.num_prompt_tokens[i] = len(prompt)
        self.token_ids_cpu[i, :len(prompt)] = prompt
        self.num_tokens_no_spec[i] = len(prompt)

    def emit(self, i: int, tokens: list[int]) -> None:
        n = int(self.num_tokens_no_spec[i])
        self.token_ids_cpu[i, n:n + len(tokens)] = tokens
        self.num_tokens_no_spec[i] = n + len(tokens)

    def remove(self, gone: set) -> None:
        """vLLM's `condense`: the last rows move down into the holes."""
        ids = self.req_ids
        holes = sorted(self.req_id_to_index.pop(r) for r in gone)
        for hole in holes:
            ids[hole] = None
        last = len(ids) - 1
        for hole in holes:
            while last >= 0 and ids[last] is None:
                last -= 1
            if hole >= last:
                break
            r, ids[last] = ids[last], None
            ids[hole] = r
            self.req_id_to_index[r] = hole
            for arr in (self.num_prompt_tokens, self.num_tokens_no_spec, self.token_ids_cpu):
                arr[hole] = arr[last]
        self.req_ids = [r for r in ids if r is not None]
        assert all(self.req_id_to_index[r] == i for i, r in enumerate(self.req_ids))


@dataclass
class Run:
    calls_us: list[float] = field(default_factory=list)  # per propose call
    rows: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)  # per call: RL step
    drafted: list[int] = field(default_factory=list)  # per call: draft tokens
    granted: list[int] = field(default_factory=list)  # per call: rows with a draft
    accepted_of: list[int] = field(default_factory=list)  # per call: of its drafts
    drafts: list[str] = field(default_factory=list)  # per call, JSON (not GC-tracked)
    emitted: int = 0
    accepted: int = 0
    history_s: float = 0.0


def build(method: str, cost: CostModel, max_spec: int, max_model_len: int, max_reqs: int,
          kind: str = "critical"):
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=max_spec),
        model_config=SimpleNamespace(max_model_len=max_model_len))
    proposer = RhymeProposer(vllm_config)
    batch = FakeInputBatch(max_reqs, max_model_len)
    runner = SimpleNamespace(input_batch=batch, drafter=proposer)
    drafter = GroupDrafter(drafter_config(SpecConfig(method=method)))  # the shipped defaults
    if kind == "critical":  # as pipeline.drafting.build.make_budget; cost learnt per pass
        budget = CriticalBudget(CriticalConfig(max_len=max_spec))
    elif kind == "tree":  # the default (spec.budget: tree)
        budget = TreeBudget(max_spec)
    else:  # as pipeline.drafting.build.budget_config, with this machine's pass cost
        budget = DraftBudget(BudgetConfig(max_len=max_spec, start_len=min(2, max_spec),
                                          min_len=1, cost=cost))
    attach(runner, drafter, budget)
    return proposer, batch, drafter


def _profiled(kind: str, rows: int) -> bool:
    return kind == "all" or (kind == "full" and rows > FULL_ROWS) \
        or (kind == "middle" and TAIL_ROWS <= rows <= FULL_ROWS) \
        or (kind == "tail" and rows < TAIL_ROWS)


def simulate(args, profiler: cProfile.Profile | None = None) -> Run:
    cost = CostModel(args.cost_base, args.cost_per_token)
    max_reqs = args.groups * args.n
    proposer, batch, drafter = build(args.method, cost, args.k, args.max_model_len, max_reqs,
                                     args.budget)
    observe_pass = getattr(proposer.budget, "observe_pass", None)
    run = Run()
    rng = random.Random(args.seed)
    work = make_workload(rng, args.groups, args.history, args.prompt_len, args.vocab,
                         args.min_len, args.max_len)
    for step in range(args.steps):  # every step revisits the prompts (one epoch each)
        if args.fresh_prompts and step:
            work = make_workload(rng, args.groups, args.history, args.prompt_len, args.vocab,
                                 args.min_len, args.max_len)
        responses = plan_step(rng, work, args.n, args.vocab, args.max_model_len - args.prompt_len)
        t0 = time.perf_counter()
        for prompt, hist in zip(work.prompts, work.history):
            drafter.set_history(prompt_hash(prompt), [HistoryResponse(h) for h in hist])
            drafter.expect_group(prompt, args.n)
        run.history_s += time.perf_counter() - t0
        plan, produced, draft_of = {}, {}, {}
        for g, prompt in enumerate(work.prompts):
            for j, response in enumerate(responses[g]):
                req_id = f"{step}-{g}-{j}"
                batch.add(req_id, prompt)
                plan[req_id], produced[req_id], draft_of[req_id] = response, 0, []
        while batch.req_ids:
            sampled = []
            for i, req_id in enumerate(batch.req_ids):  # the target's pass
                want, done, draft = plan[req_id], produced[req_id], draft_of[req_id]
                acc = 0
                while acc < len(draft) and done + acc < len(want) \
                        and draft[acc] == want[done + acc]:
                    acc += 1
                toks = want[done: done + acc + 1]
                batch.emit(i, toks)
                produced[req_id] = done + len(toks)
                sampled.append(toks)
                run.emitted += len(toks)
                run.accepted += acc
                if acc:
                    run.accepted_of[-1] += acc
            rows = len(sampled)
            profiling = profiler is not None and _profiled(args.profile_passes, rows)
            if profiling:
                profiler.enable()
            t0 = time.perf_counter()
            out = proposer.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu,
                                   slot_mappings=None)
            t1 = time.perf_counter()
            if profiling:
                profiler.disable()
            run.calls_us.append((t1 - t0) * 1e6)
            run.rows.append(rows)
            run.step.append(step)
            run.drafted.append(sum(len(d) for d in out))
            if observe_pass is not None:  # the engine's pass meter, from the model cost
                observe_pass(rows + run.drafted[-1], cost.pass_seconds(rows + run.drafted[-1]))
            run.granted.append(sum(1 for d in out if len(d)))
            run.accepted_of.append(0)
            run.drafts.append(json.dumps([list(map(int, d)) for d in out]))
            for req_id, d in zip(batch.req_ids, out):
                draft_of[req_id] = list(d)
            finished = {r for r in batch.req_ids if produced[r] >= len(plan[r])}
            if finished:
                batch.remove(finished)
        proposer.end_step()
        # the loop's history window: the H latest responses of each prompt
        work.history = [(h + r)[-args.history:] for h, r in zip(work.history, responses)]
    return run


# ------------------------------------------------------------------ report

def _summary(run: "Run", us: list[float], keep) -> str:
    idx = [i for i, n in enumerate(run.rows) if keep(n)]
    if not idx:
        return f"{'-':>8} {'-':>8} {0:>6}"
    t = [us[i] for i in idx]
    rows = sum(run.rows[i] for i in idx) / len(idx)
    granted = sum(run.granted[i] for i in idx) / len(idx)
    drafted = sum(run.drafted[i] for i in idx)
    acc = sum(run.accepted_of[i] for i in idx) / drafted if drafted else 0.0
    return (f"{statistics.fmean(t):8.0f} {statistics.median(t):8.0f} {len(t):6d} "
            f"{rows:6.0f} {granted:7.1f} {drafted / len(idx):7.1f} {acc:6.2f}")


COMPONENTS = [  # (where, what): own time of matching functions, first match wins
    ("suffix_tree.py:extend", "C++ tree extend (live tokens, tree builds)"),
    ("suffix_tree.py:remove", "C++ tree remove (groups that ended)"),
    ("suffix_tree.py:speculate", "C++ tree speculate"),
    ("suffix_tree.py:", "suffix-tree wrapper, other"),
    ("budget.py:", "budget (Python)"),
    ("critical.py:", "budget (Python)"),
    ("calibration.py:", "budget (Python)"),
    ("pass_cost.py:", "budget (Python)"),
    ("remaining.py:", "remaining lengths (Python)"),
    ("drafter.py:", "drafter (Python)"),
    ("live.py:", "live-request bookkeeping (Python)"),
    ("proposer.py:", "proposer (Python)"),
]


def _component(name: str) -> str:
    for where, what in COMPONENTS:
        if name.startswith(where):
            return what
    return "builtins, numpy, other"


def report(args, runs: list[Run], prof: cProfile.Profile | None) -> None:
    base = runs[0]
    same = [r for r in runs if r.drafts == base.drafts]
    if len(same) < len(runs):  # the code under test drafts differently from run to run
        print(f"note: {len(runs) - len(same)} of {len(runs)} repeats drafted differently; "
              "timing the others")
    best = [min(r.calls_us[i] for r in same) for i in range(len(base.calls_us))]
    cost = CostModel(args.cost_base, args.cost_per_token)
    rollout_s = sum(cost.pass_seconds(n + d) for n, d in zip(base.rows, base.drafted))
    drafter_s = sum(best) / 1e6
    print(f"method {args.method}: {args.steps} step(s) of {args.groups} x {args.n} requests, "
          f"{args.history} history responses per prompt, k={args.k}, "
          f"cost {args.cost_base * 1e3:g} ms + {args.cost_per_token * 1e3:g} ms/token")
    print(f"code under test: {Path(sys.modules['pipeline'].__file__).parent}")
    seq_passes = sum(base.rows)
    print(f"passes {len(best)}, tau {base.emitted / seq_passes:.2f}, "
          f"accept {base.accepted / max(1, sum(base.drafted)):.2f}, "
          f"drafted {sum(base.drafted)} tokens; best of {len(runs)} repeats")
    print(f"{'passes':<18} {'mean µs':>8} {'med µs':>8} {'calls':>6} {'rows':>6} "
          f"{'granted':>7} {'drafted':>7} {'accept':>6}")
    for label, keep in [("all", lambda n: True),
                        (f"full (> {FULL_ROWS} rows)", lambda n: n > FULL_ROWS),
                        ("middle", lambda n: TAIL_ROWS <= n <= FULL_ROWS),
                        (f"tail (< {TAIL_ROWS} rows)", lambda n: n < TAIL_ROWS)]:
        print(f"{label:<18} {_summary(base, best, keep)}")
    for step in range(args.steps):
        us = [u for u, s in zip(best, base.step) if s == step]
        print(f"step {step}: {len(us)} passes, mean {statistics.fmean(us):.0f} µs")
    print(f"drafter {drafter_s * 1e3:.1f} ms vs modelled rollout {rollout_s * 1e3:.0f} ms: "
          f"{100 * drafter_s / (rollout_s + drafter_s):.2f} % of rollout time; "
          f"set_history {base.history_s * 1e3:.1f} ms (between steps, not counted)")
    if prof is None:
        return
    stats = pstats.Stats(prof)
    passes = sum(1 for n in base.rows if _profiled(args.profile_passes, n))
    rows = []
    for (file, line, name), (cc, nc, tt, ct, _) in stats.stats.items():
        where = Path(file).name if file != "~" else ""
        rows.append((tt, ct, nc, f"{where}:{name}" if where else name))
    total = sum(r[0] for r in rows)
    print(f"\ncProfile of {args.profile_passes} passes ({passes}; one more repeat; µs per "
          f"pass, profiler overhead included; total {1e6 * total / passes:.0f})")
    parts: dict[str, float] = {}
    for tt, _, _, name in rows:
        parts[_component(name)] = parts.get(_component(name), 0.0) + tt
    print(f"{'component':<44} {'µs/pass':>7} {'share':>7}")
    for part, tt in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"{part:<44} {1e6 * tt / passes:7.0f} {100 * tt / total:6.1f}%")
    print(f"\n{'function':<44} {'own':>7} {'cum':>7} {'calls/pass':>10}")
    for tt, ct, nc, name in sorted(rows, reverse=True)[: args.top]:
        print(f"{name[:44]:<44} {1e6 * tt / passes:7.0f} {1e6 * ct / passes:7.0f} "
              f"{nc / passes:10.1f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", default="history+group",
                    choices=["history", "group", "history+group"])
    ap.add_argument("--budget", choices=("tree", "critical", "throughput"), default="tree")
    ap.add_argument("--groups", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--history", type=int, default=16, help="history responses per prompt")
    ap.add_argument("--prompt-len", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=40)
    ap.add_argument("--min-len", type=int, default=40, help="shortest planned response")
    ap.add_argument("--max-len", type=int, default=160, help="longest planned response")
    ap.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    ap.add_argument("--max-model-len", type=int, default=256)
    ap.add_argument("--cost-base", type=float, default=0.006, help="seconds per pass")
    ap.add_argument("--cost-per-token", type=float, default=0.00014,
                    help="seconds per scheduled token")
    ap.add_argument("--steps", type=int, default=2,
                    help="RL steps; each revisits the prompts, whose history window then "
                         "holds the previous step's responses")
    ap.add_argument("--fresh-prompts", action="store_true",
                    help="new prompts every step (their trees are built during the rollout)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--profile-passes", default="all",
                    choices=["all", "full", "middle", "tail"], help="passes cProfile sees")
    ap.add_argument("--top", type=int, default=14, help="cProfile rows shown")
    ap.add_argument("--dump", type=Path, help="write every pass's drafts here (JSON)")
    ap.add_argument("--times", type=Path, help="write every pass's best time here (JSON)")
    args = ap.parse_args(argv)
    runs = [simulate(args) for _ in range(args.repeats)]
    prof = None
    if not args.no_profile:
        prof = cProfile.Profile()
        simulate(args, prof)
    report(args, runs, prof)
    if args.times:
        base = runs[0]
        best = [min(r.calls_us[i] for r in runs if r.drafts == base.drafts)
                for i in range(len(base.calls_us))]
        args.times.write_text(json.dumps({"us": best, "rows": base.rows, "step": base.step,
                                          "drafted": base.drafted}))
    if args.dump:
        args.dump.write_text(json.dumps({"rows": runs[0].rows,
                                         "drafts": [json.loads(d) for d in runs[0].drafts]}))


if __name__ == "__main__":
    main()
