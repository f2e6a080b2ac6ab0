"""What an EAGLE-1 head on the policy's hidden states would draft on a run's recorded
rollouts, trained online as the run went, optionally warmed up first on the starting
policy's own responses (research tool; no engine, no vLLM):

    python -m pipeline.bench.eagle_replay RUN_DIR [--steps N] [--k 8] [--updates 20]
        [--lr 1e-3] [--max-fraction 0.1] [--json OUT] [--threads 1]
        [--warm-corpus FILE [--warm-updates 200] [--warm-prompts 64] [--warm-samples 4]
        [--warm-max-new 256]]

The counterpart of `pipeline.bench.draft_model_replay` (the product's token-only draft)
with the same replay, the same warm-up corpus (`pipeline.bench.warm_corpus`) and the same
order: each recorded step is drafted first, then trained on. Drafting replays as
`rhymectl bench replay` does: every pass drafts `k` greedy tokens and emits the longest
prefix matching the recorded response, plus one token.

A step's features come from the policy that sampled it: the run's checkpoint of that step
(`checkpoints/step-N/policy`, the weights after N updates) where the run kept one, else
the newest one before it, else the starting model (`run.checkpoint_every=1` keeps them
all). The head (`pipeline.bench.eagle_head`) is EAGLE-1's; its layer and `fc` are within
`--max-fraction` of the policy's parameters, as the token draft's layers are.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from pipeline.atomic import write_atomic
from pipeline.process_exit import exit_now


def sampler_dir(run_dir: Path, step: int, start: Path) -> Path:
    """The policy that sampled step `step` (0-based): the newest kept checkpoint of at most
    `step` updates, else the starting model."""
    best = start
    for d in sorted((Path(run_dir) / "checkpoints").glob("step-*")):
        n = int(d.name.split("-")[1])
        if n <= step and (d / "policy" / "config.json").is_file():
            best = d / "policy"
    return best


def replay_passes(head, prompts, responses, feats, k: int) -> list[int]:
    """Passes each response takes when every pass drafts `k` greedy tokens of the head
    (batched over the responses still running) and accepts the draft's prefix that
    matches the recorded response, plus one token."""
    from pipeline.bench.draft_model_replay import accept
    from pipeline.bench.eagle_head import draft_cached, prefix_states

    states = prefix_states(head, [p + r for p, r in zip(prompts, responses)], feats)
    done = [0] * len(responses)
    passes = [0] * len(responses)
    live = [i for i, r in enumerate(responses) if r]
    while live:
        drafts = draft_cached(head, [states[i] for i in live],
                              [len(prompts[i]) + done[i] for i in live], k)[0].tolist()
        live = accept(responses, live, drafts, done, passes)
    return passes


def main(argv=None) -> int:
    from pipeline.bench.draft_model_replay import replay_parser

    ap = replay_parser("python -m pipeline.bench.eagle_replay", updates=20)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--window", type=int, default=3, help="steps an update draws from")
    ap.add_argument("--source-layer", type=int, default=0,
                    help="the policy layer the head's layer starts from")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    from pipeline.bench.eagle_head import EagleHead, HeadTrainer, examples_of, policy_features
    from pipeline.bench.replay_run import load_run
    from pipeline.drafting.draft_model import policy_parameters, policy_state

    cfg, steps = load_run(args.run_dir, [])
    if args.steps:
        steps = steps[:args.steps]
    start = Path(cfg.model.path)
    config, state = policy_state(start)
    head = EagleHead(config, state, args.max_fraction, args.source_layer, args.seed)
    trainer = HeadTrainer(head, args.updates, window=args.window, lr=args.lr, seed=args.seed)
    print(f"EAGLE head: MLP {head.shape.intermediate_size}, {head.own_parameters():,} own "
          f"parameters ({head.own_parameters() / policy_parameters(config):.1%} of the "
          "policy's)", flush=True)
    warm = None
    if args.warm_corpus:
        from pipeline.bench.warm_corpus import corpus_at

        corpus = corpus_at(args.warm_corpus, cfg, args.warm_prompts, args.warm_samples,
                           args.warm_max_new, args.seed)
        t = time.perf_counter()
        feats = policy_features(start, [p + r for p, r in corpus])
        feat_s = time.perf_counter() - t
        report = trainer.warm_up(examples_of([p for p, _ in corpus], [r for _, r in corpus],
                                             feats), args.warm_updates)
        warm = {"responses": len(corpus), "tokens": sum(len(r) for _, r in corpus),
                "updates": args.warm_updates, "features_s": feat_s,
                "loss_before": report.loss_before, "loss_after": report.loss_after,
                "train_s": report.seconds}
        print(f"warm-up: {len(corpus)} responses, loss {report.loss_before:.3f} -> "
              f"{report.loss_after:.3f} in {report.seconds:.0f} s (features {feat_s:.0f} s)",
              flush=True)
    rows = []
    for st in steps:
        prompts = [list(p) for p, g in zip(st.prompts, st.responses) for _ in g]
        responses = [list(r) for g in st.responses for r in g]
        policy = sampler_dir(args.run_dir, st.step, start)
        t = time.perf_counter()
        feats = policy_features(policy, [p + r for p, r in zip(prompts, responses)])
        feat_s = time.perf_counter() - t
        t = time.perf_counter()
        passes = replay_passes(head, prompts, responses, feats, args.k)
        replay_s = time.perf_counter() - t
        report = trainer.train(examples_of(prompts, responses, feats))
        tokens = sum(map(len, responses))
        row = {"step": st.step, "features_from": policy.parent.name if policy != start
               else "start", "critical_passes": max(passes),
               "none_critical": max(map(len, responses)), "request_passes": sum(passes),
               "tokens": tokens, "tau": tokens / max(sum(passes), 1),
               "loss_before": report.loss_before, "loss_after": report.loss_after,
               "train_s": report.seconds, "replay_s": replay_s, "features_s": feat_s}
        rows.append(row)
        print(f"step {st.step:3d} ({row['features_from']}): critical path "
              f"{row['critical_passes']:4d} (none {row['none_critical']}), request-passes "
              f"{row['request_passes']}, tau {row['tau']:.2f}, loss {report.loss_before:.3f} "
              f"-> {report.loss_after:.3f}, train {report.seconds:.1f} s", flush=True)
    total = {"critical_passes": sum(r["critical_passes"] for r in rows),
             "request_passes": sum(r["request_passes"] for r in rows),
             "tokens": sum(r["tokens"] for r in rows)}
    print(f"all steps: critical path {total['critical_passes']}, request-passes "
          f"{total['request_passes']}, tau {total['tokens'] / max(total['request_passes'], 1):.2f}")
    if args.json:
        result = {"run_dir": Path(args.run_dir).name, "k": args.k, "updates": args.updates,
                  "lr": args.lr, "window": args.window, "max_fraction": args.max_fraction,
                  "own_parameters": head.own_parameters(), "steps": rows, "total": total,
                  "warm_up": warm}
        write_atomic(args.json, lambda tmp: tmp.write_text(json.dumps(result, indent=1)))
    return 0


if __name__ == "__main__":
    from pipeline.bench.draft_model_replay import run_tool

    exit_now(run_tool(main))
