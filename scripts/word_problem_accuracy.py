"""mean@k accuracy of a model on the GSM8K-format word problems, by difficulty, sampled by
rhymectl's vLLM engine with the prompts as a run encodes them (the model's chat template).

    python scripts/word_problem_accuracy.py MODEL_DIR [--steps 1 2 mix] [--temps 1.0 0.7]
        [--problems 32] [--k 4] [--max-tokens 256] [--system-prompt TEXT] [--json FILE]

A level is a number of solution steps (the templates of pipeline.tasks.word_problems have 1
to 5), `add` or `times` (the one-step addition or multiplication template alone), `small-add`
(one addition of two one-digit numbers, in words: the gsm8k-easy data set's template),
`sum` or `small-sum` (a bare "What is a + b?", up to 20 or 9), `mix`: the shipped sample_data/gsm8k test rows, or `sample:NAME`: the
test rows of the shipped data set NAME (`sample:gsm8k-easy`). For each level and temperature:
mean@k (the share of correct responses: each problem's k samples, averaged), pass@k, the
mean response length and how often responses hit the cap; scored by the built-in gsm8k
reward without partial credit. Problems of a level are drawn with a seed the training rows
do not use. A research helper for choosing a task the model can partly solve; not part of
the tool.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config.schema import DataConfig, ModelConfig, RolloutConfig  # noqa: E402
from pipeline.rollout.contract import Sampling  # noqa: E402
from pipeline.rollout.engine import RolloutEngine  # noqa: E402
from pipeline.tasks.chat import PromptEncoder  # noqa: E402
from pipeline.tasks.math_rewards import gsm8k_reward  # noqa: E402
from pipeline.tasks.sample_data import sample_split  # noqa: E402
from pipeline.tasks.word_problems import _boxes, _more, _small_more, gsm8k_rows  # noqa: E402



def _sum(rng: random.Random) -> tuple[str, list[str], int]:
    a, b = rng.randint(1, 20), rng.randint(1, 20)
    return f"What is {a} + {b}?", [f"{a}+{b} = <<{a}+{b}={a + b}>>{a + b}"], a + b


def _small_sum(rng: random.Random) -> tuple[str, list[str], int]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return f"What is {a} + {b}?", [f"{a}+{b} = <<{a}+{b}={a + b}>>{a + b}"], a + b


TEMPLATE_LEVELS = {"add": _more, "times": _boxes, "sum": _sum, "small-add": _small_more,
                   "small-sum": _small_sum}

LEVEL_SEED = 101  # not a seed the sample data or SFT rows use


def level_rows(level: str, n: int) -> list[dict]:
    if level == "mix":
        return sample_split("gsm8k")["test"][:n]
    if level.startswith("sample:"):  # a shipped data set's test rows
        return sample_split(level.split(":", 1)[1])["test"][:n]
    if level in TEMPLATE_LEVELS:  # one template alone
        rng, rows = random.Random(LEVEL_SEED), {}
        while len(rows) < n:
            question, lines, final = TEMPLATE_LEVELS[level](rng)
            rows[question] = "\n".join(lines + [f"#### {final}"])
        return [{"question": q, "answer": a} for q, a in rows.items()]
    return gsm8k_rows(n, LEVEL_SEED, steps=(int(level),))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--steps", nargs="+", default=["1", "2", "mix"])
    ap.add_argument("--temps", nargs="+", type=float, default=[1.0, 0.7])
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--system-prompt", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    encoder = PromptEncoder.from_config(DataConfig(chat_template="auto", system_prompt=args.system_prompt),
                                        AutoTokenizer.from_pretrained(args.model))
    levels = {lv: level_rows(lv, args.problems) for lv in args.steps}
    prompts = {lv: encoder.encode_many([r["question"] for r in rows]) for lv, rows in levels.items()}
    longest = max(len(p) for ps in prompts.values() for p in ps)
    engine = RolloutEngine(ModelConfig(path=args.model), RolloutConfig(max_num_seqs=256),
                           longest + args.max_tokens + 8, seed=0)
    results = []
    for temp in args.temps:
        for lv, rows in levels.items():
            started = time.time()
            out = engine.generate(prompts[lv], Sampling(n=args.k, temperature=temp,
                                                        max_tokens=args.max_tokens, seed=0,
                                                        logprobs=False))
            scores, lengths, capped = [], [], 0
            for row, group in zip(rows, out.groups):
                texts = [encoder.decode(c.token_ids) for c in group]
                scores.append([gsm8k_reward(row["question"], t, row["answer"]) for t in texts])
                lengths += [len(c.token_ids) for c in group]
                capped += sum(c.finish_reason == "length" for c in group)
            per_problem = [sum(s) / len(s) for s in scores]
            mean = sum(per_problem) / len(per_problem)
            se = math.sqrt(sum((p - mean) ** 2 for p in per_problem) / max(1, len(per_problem) - 1)
                           / len(per_problem))
            result = {"level": lv, "temperature": temp, "problems": len(rows), "k": args.k,
                      "mean_at_k": round(mean, 4), "se": round(se, 4),
                      "pass_at_k": round(sum(max(s) for s in scores) / len(scores), 4),
                      "mean_tokens": round(sum(lengths) / len(lengths), 1),
                      "capped": round(capped / len(lengths), 3),
                      "seconds": round(time.time() - started, 1),
                      "example": texts[0][:300]}
            results.append(result)
            print(json.dumps(result), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
