"""What a draft model of the policy would draft on a run's recorded rollouts, step by step,
trained online as the run went (research tool; no engine, no vLLM):

    python -m pipeline.bench.draft_model_replay RUN_DIR [--steps N] [--k 8] [--updates 40]
        [--layers 1] [--max-fraction 0.1] [--draft-vocab 0] [--json OUT] [--threads 1]
        [--choice] [--warm-corpus FILE [--warm-updates 200] [--warm-distill 8]
        [--warm-prompts 64] [--warm-samples 4] [--warm-max-new 256]]

The draft is built from the run's starting policy (`model.path`, `from_policy`). For each
recorded step in order it first drafts that step's responses, then trains on them (the
order the loop would use: a step's rollouts train the draft for the next one). Drafting is
replayed as `rhymectl bench replay` does: since a one-hot draft token is accepted exactly
where the target sampled it, every pass emits the longest prefix of the draft that matches
the recorded response plus one token, so each response's passes and each step's critical
path (its longest request's passes, every request starting in the first pass) follow from
the recorded tokens alone. The draft always drafts `k` tokens; no tree is asked.

Printed per step: the draft's critical path and total request-passes against `none`'s,
tau, the weighted loss before and after the step's training and its seconds; with
`--choice`, the same step replayed again with each pass's model drafts sized by
`pipeline.drafting.choice` (no tree; the rule's remaining lengths from the step's own
recorded group lengths, an optimistic predictor). At the end: `propose` milliseconds per
pass at 32 and 128 rows of the last step's contexts.

`--warm-corpus FILE`: before the first step the draft trains `--warm-updates` updates on
the starting policy's own responses to other prompts of the data set
(`pipeline.bench.warm_corpus`: read from FILE, or generated and written there), each
token against the policy's `--warm-distill` most likely tokens (0: the sampled token).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import median

import torch

from pipeline.atomic import write_atomic
from pipeline.bench.warm_corpus import add_warm_arguments
from pipeline.process_exit import exit_now


def replay_passes(model, prompts, responses, k: int, keep=None) -> tuple[list[int], int]:
    """Passes each response takes when every pass drafts `k` greedy tokens of `model`
    (batched over the responses still running) and accepts the draft's prefix that
    matches the recorded response, plus one token; and the draft tokens verified.

    keep(live, drafts, probs, done, passes): how many tokens of each draft to verify
    (None: all of them)."""
    from pipeline.drafting.draft_propose import propose

    done = [0] * len(responses)  # response tokens emitted so far
    passes = [0] * len(responses)
    verified = 0
    live = [i for i, r in enumerate(responses) if r]
    while live:
        contexts = [prompts[i] + responses[i][:done[i]] for i in live]
        drafts, probs = propose(model, contexts, k)
        if keep is not None:
            drafts = [d[:n] for d, n in zip(drafts, keep(live, drafts, probs, done, passes))]
        verified += sum(map(len, drafts))
        live = accept(responses, live, drafts, done, passes)
    return passes, verified


def accept(responses, live: list[int], drafts, done: list[int], passes: list[int]) -> list[int]:
    """One replayed pass: each live response i emits the longest prefix of its draft that
    matches its recorded tokens after done[i], plus one token (a one-hot draft token is
    accepted exactly where the target sampled it); returns the responses still running."""
    for i, draft in zip(live, drafts):
        rest = responses[i][done[i]:]
        match = 0
        while match < min(len(draft), len(rest) - 1) and draft[match] == rest[match]:
            match += 1
        done[i] += match + 1
        passes[i] += 1
    return [i for i in live if done[i] < len(responses[i])]


def choice_keep(groups: list[int], lengths: list[int], model_pass_s: float,
                model_row_s: float, k: int):
    """A `keep` that sizes each model draft by `pipeline.drafting.choice` (no tree: the
    model's draft or nothing), the remaining length predicted from the mean and spread
    of the request's group's recorded lengths (this step's: an optimistic predictor)."""
    from statistics import mean, pstdev

    from pipeline.costs import DRAFT_COST
    from pipeline.drafting.choice import ChoiceCosts, Options, SourceDraft, choose

    costs = ChoiceCosts(DRAFT_COST, model_pass_s=model_pass_s, model_row_s=model_row_s,
                        max_len=k)
    stats = {}
    for g in set(groups):
        ls = [n for n, gg in zip(lengths, groups) if gg == g]
        stats[g] = (mean(ls), pstdev(ls))

    def keep(live, drafts, probs, done, passes):
        options = []
        for i, d, p in zip(live, drafts, probs):
            m, sd = stats[groups[i]]
            options.append(Options(i, None, SourceDraft(tuple(d), tuple(p)),
                                   (max(m - done[i], 1.0), sd),
                                   done[i] / passes[i] if passes[i] else 1.0))
        return [len(c.tokens) for c in choose(options, costs)]
    return keep


def _propose_ms(model, contexts, k: int, rows: int, repeats: int = 5) -> float:
    from pipeline.drafting.draft_propose import propose

    batch = (contexts * (rows // max(len(contexts), 1) + 1))[:rows]
    propose(model, batch, k)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        propose(model, batch, k)
        times.append(time.perf_counter() - t)
    return 1000 * median(times)


def _warm_up(trainer, cfg, policy_dir: Path, args) -> dict:
    """Train `trainer`'s model on the warm-up corpus (`--warm-*`) as a run's warm-up does
    (`DraftTrainer.warm_up`: an optimizer and batch order of its own, its tokens counted
    toward the draft vocabulary); the per-step training then starts from these weights."""
    from pipeline.bench.warm_corpus import corpus_at
    from pipeline.train.teacher import policy_teachers

    corpus = corpus_at(args.warm_corpus, cfg, args.warm_prompts, args.warm_samples,
                       args.warm_max_new, args.seed)
    t = time.perf_counter()
    data = corpus
    if args.warm_distill:
        teachers = policy_teachers(policy_dir, corpus, args.warm_distill)
        data = [(p, r, teacher) for (p, r), teacher in zip(corpus, teachers)]
    teach_s = time.perf_counter() - t
    report = trainer.warm_up(data, args.warm_updates)
    out = {"responses": len(corpus), "tokens": sum(len(r) for _, r in corpus),
           "updates": args.warm_updates, "distill": args.warm_distill, "teacher_s": teach_s,
           "loss_before": report.loss_before, "loss_after": report.loss_after,
           "train_s": report.seconds}
    print(f"warm-up: {out['responses']} responses, {out['tokens']} tokens, loss "
          f"{report.loss_before:.3f} -> {report.loss_after:.3f} in {report.seconds:.0f} s "
          f"(teacher {teach_s:.0f} s)", flush=True)
    return out


def run_tool(main, argv=None) -> int:
    """`main(argv)` of a replay tool, a bad input (`UsageError`: no run directory, a
    missing model) one line on stderr and exit code 2 instead of a traceback."""
    from pipeline.errors import UsageError

    try:
        return main(argv)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def replay_parser(prog: str, updates: int) -> argparse.ArgumentParser:
    """The options every draft replay tool takes (`draft_model_replay`, `eagle_replay`):
    the run, the steps, the draft length, the updates a step, the draft's share of the
    policy, threads, seed, JSON output and the warm-up's `--warm-*`."""
    ap = argparse.ArgumentParser(prog=prog)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--steps", type=int, default=0, help="replay the first N steps (0: all)")
    ap.add_argument("--k", type=int, default=8, help="draft tokens a pass")
    ap.add_argument("--updates", type=int, default=updates, help="AdamW updates per step")
    ap.add_argument("--max-fraction", type=float, default=0.10)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    add_warm_arguments(ap)
    return ap


def main(argv=None) -> int:
    ap = replay_parser("python -m pipeline.bench.draft_model_replay", updates=40)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--draft-vocab", type=int, default=0,
                    help="draft from the N most frequent trained-on tokens (0: all)")
    ap.add_argument("--choice", action="store_true",
                    help="also replay each step with model drafts sized by the choice rule")
    ap.add_argument("--model-pass-ms", type=float, default=3.0,
                    help="the choice rule's price of running the draft model in a pass")
    ap.add_argument("--model-row-ms", type=float, default=0.03,
                    help="the choice rule's price of one row of the draft model's batch")
    ap.add_argument("--warm-distill", type=int, default=8,
                    help="the warm-up learns the policy's top-K tokens (0: the sampled ones)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from safetensors.torch import load_file

    from pipeline.bench.replay_run import load_run
    from pipeline.drafting.draft_model import from_policy, policy_parameters, shape_for
    from pipeline.drafting.draft_train import DraftTrainer, TrainSettings

    cfg, steps = load_run(args.run_dir, [])
    if args.steps:
        steps = steps[:args.steps]
    policy_dir = Path(cfg.model.path)
    config = json.loads((policy_dir / "config.json").read_text())
    state = load_file(str(policy_dir / "model.safetensors"))
    shape = shape_for(config, layers=args.layers, max_fraction=args.max_fraction)
    trainer = DraftTrainer(from_policy(config, state, shape, seed=args.seed),
                           TrainSettings(updates=args.updates, draft_vocab=args.draft_vocab),
                           seed=args.seed)
    print(f"draft: {shape.layers} layer(s), MLP {shape.intermediate_size}, "
          f"{shape.own_parameters():,} own parameters "
          f"({shape.own_parameters() / policy_parameters(config):.1%} of the policy's), "
          f"{shape.parameters():,} with the embedding")
    warm = _warm_up(trainer, cfg, policy_dir, args) if args.warm_corpus else None
    rows = []
    for st in steps:
        prompts, responses, groups = [], [], []
        for g, (p, group) in enumerate(zip(st.prompts, st.responses)):
            for r in group:
                prompts.append(list(p))
                responses.append(list(r))
                groups.append(g)
        t = time.perf_counter()
        passes, verified = replay_passes(trainer.model, prompts, responses, args.k)
        replay_s = time.perf_counter() - t
        chosen = {}
        if args.choice:
            keep = choice_keep(groups, list(map(len, responses)), args.model_pass_ms / 1000,
                               args.model_row_ms / 1000, args.k)
            c_passes, c_verified = replay_passes(trainer.model, prompts, responses, args.k, keep)
            chosen = {"choice_critical_passes": max(c_passes),
                      "choice_request_passes": sum(c_passes), "choice_verified": c_verified}
        report = trainer.train(list(zip(prompts, responses)))
        tokens = sum(map(len, responses))
        row = {"step": st.step, "critical_passes": max(passes),
               "none_critical": max(map(len, responses)), "request_passes": sum(passes),
               "tokens": tokens, "tau": tokens / max(sum(passes), 1), "verified": verified,
               **chosen,
               "loss_before": report.loss_before, "loss_after": report.loss_after,
               "train_s": report.seconds, "replay_s": replay_s}
        rows.append(row)
        print(f"step {st.step:3d}: critical path {row['critical_passes']:4d} (none "
              f"{row['none_critical']}), tau {row['tau']:.2f}, loss {report.loss_before:.3f}"
              f" -> {report.loss_after:.3f}, train {report.seconds:.2f} s"
              + (f"; choice: critical path {chosen['choice_critical_passes']}, verified "
                 f"{chosen['choice_verified']} of {verified}" if chosen else ""), flush=True)
    last = steps[-1]
    contexts = [list(p) + list(r[:len(r) // 2]) for p, g in zip(last.prompts, last.responses)
                for r in g]
    timing = {f"propose_ms_{n}_rows": _propose_ms(trainer.model, contexts, args.k, n)
              for n in (32, 128)}
    print(", ".join(f"{k}: {v:.1f}" for k, v in timing.items()))
    if args.json:
        result = {"run_dir": str(args.run_dir), "k": args.k, "updates": args.updates,
                  "threads": args.threads, "shape": shape.__dict__, "steps": rows, **timing,
                  "warm_up": warm}
        write_atomic(args.json, lambda tmp: tmp.write_text(json.dumps(result, indent=1)))
    return 0


if __name__ == "__main__":
    exit_now(run_tool(main))
