"""Write a production-shaped length trace (`sched_lab.synth`) as the CSV `rhymectl bench
sched --trace` reads (group,length,epoch rows).

    python scripts/sched_trace.py prod.csv [--prompts 1024] [--seed 0] [--mean-tokens 25000]
        [--max-tokens 65536]
"""

from __future__ import annotations

import argparse

from sched_lab.synth import Shape, production_trace, write_csv


def main() -> None:
    shape = Shape()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="CSV file to write")
    ap.add_argument("--prompts", type=int, default=shape.prompts)
    ap.add_argument("--n", type=int, default=shape.n, help="responses per prompt")
    ap.add_argument("--epochs", type=int, default=shape.epochs)
    ap.add_argument("--mean-tokens", type=float, default=shape.mean_tokens)
    ap.add_argument("--max-tokens", type=int, default=shape.max_tokens)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    shape = Shape(prompts=args.prompts, n=args.n, epochs=args.epochs,
                  mean_tokens=args.mean_tokens, max_tokens=args.max_tokens)
    trace = production_trace(shape, args.seed)
    write_csv(trace, args.out)
    print(f"{args.out}: {trace.source}, {len(trace.groups)} groups")


if __name__ == "__main__":
    main()
