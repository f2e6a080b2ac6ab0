"""GSM8K-format word problems, generated from templates (pure Python, same rows per seed).

A row has GSM8K's two columns:

    question  "Mia buys 3 packs of 4 pens and gives 5 pens to a friend. How many ..."
    answer    "Mia buys 3*4 = <<3*4=12>>12 pens.\\nMia has 12-5 = <<12-5=7>>7 pens left.\\n#### 7"

one step per line, each with GSM8K's `<<expression=result>>` calculator annotation, and the
final answer after `####` on the last line. Each template has a fixed number of steps (1 to
5), so solution lengths vary by template; numbers are small whole numbers and every
intermediate result is a whole, non-negative number. A tiny model can learn the format;
the templates are not meant to teach arithmetic.
"""

from __future__ import annotations

import random
from typing import Callable

from pipeline.errors import UsageError

NAMES = ("Mia", "Noah", "Ava", "Liam", "Zoe", "Omar", "Lena", "Ravi", "Sara", "Tom",
         "Ines", "Kofi", "Yuki", "Ben", "Nora", "Eli", "Maya", "Leo", "Ana", "Sam")
ITEMS = ("apples", "pens", "stickers", "marbles", "cookies", "books", "shells", "cards",
         "beads", "stamps", "balloons", "candles")
MAX_TRIES_PER_ROW = 100  # distinct questions: give up when the templates run out


def calc(a: int, op: str, b: int) -> tuple[str, int]:
    """`a op b` as GSM8K writes it, "3*4 = <<3*4=12>>12", and its whole-number value."""
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
    if value < 0 or (op == "/" and a % b):
        raise ValueError(f"{a}{op}{b} is not a whole non-negative number")
    expr = f"{a}{op}{b}"
    return f"{expr} = <<{expr}={value}>>{value}", value


def _dollars(step: str) -> str:
    """GSM8K writes money as "3*4 = $<<3*4=12>>12"."""
    return step.replace("= ", "= $", 1)


def _more(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 30), rng.randint(2, 20)
    s, total = calc(a, "+", b)
    return (f"{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does "
            f"{name} have now?", [f"{name} has {s} {item} now."], total)


def _boxes(rng: random.Random) -> tuple[str, list[str], int]:
    item = rng.choice(ITEMS)
    a, b = rng.randint(2, 12), rng.randint(2, 9)
    s, total = calc(a, "*", b)
    return (f"A box holds {a} {item}. How many {item} are in {b} boxes?",
            [f"{b} boxes hold {s} {item}."], total)


def _packs(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 9), rng.randint(2, 10)
    c = rng.randint(1, a * b)
    s1, bought = calc(a, "*", b)
    s2, left = calc(bought, "-", c)
    return (f"{name} buys {a} packs of {b} {item} and gives {c} {item} to a friend. How many "
            f"{item} does {name} have left?",
            [f"{name} buys {s1} {item}.", f"{name} has {s2} {item} left."], left)


def _wages(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    pay, h1, h2 = rng.randint(5, 20), rng.randint(1, 8), rng.randint(1, 8)
    s1, hours = calc(h1, "+", h2)
    s2, earned = calc(hours, "*", pay)
    return (f"{name} earns ${pay} an hour. {name} works {h1} hours on Monday and {h2} hours "
            f"on Tuesday. How much does {name} earn in total?",
            [f"{name} works {s1} hours.", f"{name} earns {_dollars(s2)}."], earned)


def _share(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends = rng.randint(2, 6)
    bags, per_bag = rng.randint(2, 6), rng.randint(2, 8)
    have = rng.randint(1, 6) * friends + (-bags * per_bag) % friends  # total divides evenly
    s1, bought = calc(bags, "*", per_bag)
    s2, total = calc(have, "+", bought)
    s3, each = calc(total, "/", friends)
    return (f"{name} has {have} {item} and buys {bags} bags with {per_bag} {item} in each bag. "
            f"{name} shares all the {item} equally among {friends} friends. How many {item} "
            f"does each friend get?",
            [f"The bags hold {s1} {item}.", f"{name} has {s2} {item} in all.",
             f"Each friend gets {s3} {item}."], each)


def _garden(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    rows, per_row, days = rng.randint(2, 8), rng.randint(3, 9), rng.randint(2, 6)
    eaten = rng.randint(1, min(5, rows * per_row // days))  # never more than there is
    s1, plants = calc(rows, "*", per_row)
    s2, lost = calc(eaten, "*", days)
    s3, left = calc(plants, "-", lost)
    return (f"{name} plants {rows} rows of {per_row} carrots. Rabbits eat {eaten} carrots a "
            f"day for {days} days. How many carrots are left?",
            [f"{name} plants {s1} carrots.", f"The rabbits eat {s2} carrots.",
             f"There are {s3} carrots left."], left)


def _change(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    pen, book = rng.randint(1, 5), rng.randint(2, 9)
    pens, books = rng.randint(1, 6), rng.randint(1, 4)
    s1, p = calc(pens, "*", pen)
    s2, q = calc(books, "*", book)
    s3, cost = calc(p, "+", q)
    bill = next(b for b in (10, 20, 50, 100) if b >= cost)
    s4, change = calc(bill, "-", cost)
    return (f"Pens cost ${pen} each and notebooks cost ${book} each. {name} buys {pens} pens "
            f"and {books} notebooks and pays with a ${bill} bill. How much change does {name} "
            f"get?",
            [f"The pens cost {_dollars(s1)}.", f"The notebooks cost {_dollars(s2)}.",
             f"Everything costs {_dollars(s3)}.", f"{name} gets {_dollars(s4)} in change."], change)


def _trip(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    speed, hours, back = rng.randint(20, 60), rng.randint(2, 5), rng.randint(1, 3)
    stop = rng.randint(5, 30)
    s1, first = calc(speed, "*", hours)
    s2, second = calc(speed, "*", back)
    s3, driven = calc(first, "+", second)
    s4, total = calc(driven, "+", stop)
    return (f"{name} drives at {speed} miles an hour for {hours} hours, then for {back} more "
            f"hours at the same speed, and then walks {stop} miles. How many miles does {name} "
            f"travel in all?",
            [f"The first drive is {s1} miles.", f"The second drive is {s2} miles.",
             f"{name} drives {s3} miles.", f"In all {name} travels {s4} miles."], total)


def _bakery(rng: random.Random) -> tuple[str, list[str], int]:
    a, b = rng.randint(2, 5), rng.randint(6, 12)
    c, d = rng.randint(2, 5), rng.randint(6, 12)
    box = rng.randint(2, 6)
    made = a * b + c * d
    sold = rng.randint(1, made - box)
    sold += (made - sold) % box  # the rest fills whole boxes
    s1, morning = calc(a, "*", b)
    s2, afternoon = calc(c, "*", d)
    s3, total = calc(morning, "+", afternoon)
    s4, rest = calc(total, "-", sold)
    s5, boxes = calc(rest, "/", box)
    return (f"A bakery bakes {a} trays of {b} muffins in the morning and {c} trays of {d} "
            f"muffins in the afternoon. It sells {sold} muffins and packs the rest in boxes of "
            f"{box}. How many boxes does it fill?",
            [f"In the morning it bakes {s1} muffins.", f"In the afternoon it bakes {s2} muffins.",
             f"It bakes {s3} muffins in all.", f"{s4} muffins are left.",
             f"They fill {s5} boxes."], boxes)


def _savings(rng: random.Random) -> tuple[str, list[str], int]:
    name = rng.choice(NAMES)
    weekly, weeks, gift = rng.randint(2, 10), rng.randint(2, 8), rng.randint(5, 20)
    jars = rng.randint(2, 5)
    saved = weekly * weeks + gift
    spent = rng.randint(1, saved - jars)
    spent += (saved - spent) % jars
    s1, weekly_total = calc(weekly, "*", weeks)
    s2, total = calc(weekly_total, "+", gift)
    s3, rest = calc(total, "-", spent)
    s4, per_jar = calc(rest, "/", jars)
    s5, doubled = calc(per_jar, "*", 2)
    return (f"{name} saves ${weekly} a week for {weeks} weeks and gets ${gift} as a gift. "
            f"{name} spends ${spent} on a game and splits the rest equally among {jars} jars. "
            f"Then the money in one jar is doubled. How much money is in that jar?",
            [f"{name} saves {_dollars(s1)}.", f"With the gift {name} has {_dollars(s2)}.",
             f"After the game {name} has {_dollars(s3)}.", f"Each jar gets {_dollars(s4)}.",
             f"Doubled, the jar holds {_dollars(s5)}."], doubled)


def _small_more(rng: random.Random) -> tuple[str, list[str], int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    s, total = calc(a, "+", b)
    return (f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
            [f"{name} has {s} {item} now."], total)


Template = Callable[[random.Random], tuple[str, list[str], int]]
# (steps, template): two templates per number of steps.
TEMPLATES: tuple[tuple[int, Template], ...] = (
    (1, _more), (1, _boxes), (2, _packs), (2, _wages), (3, _share), (3, _garden),
    (4, _change), (4, _trip), (5, _bakery), (5, _savings),
)


# Below the shipped mix: one addition of two one-digit numbers, in words. SmolLM2-135M-
# Instruct gets 21-24 % of them right at T = 0.7 (mean@4), where it gets 7-12 % of the
# one-step problems above and 2 % of the mix (docs/guide.md, "A real pretrained model").
EASY_TEMPLATES: tuple[tuple[int, Template], ...] = ((1, _small_more),)


def gsm8k_easy_rows(n: int, seed: int) -> list[dict[str, str]]:
    """`n` rows like `gsm8k_rows`', each one addition of two one-digit numbers."""
    return gsm8k_rows(n, seed, templates=EASY_TEMPLATES)


def gsm8k_rows(n: int, seed: int, steps: tuple[int, ...] | None = None,
               templates: tuple[tuple[int, Template], ...] = TEMPLATES) -> list[dict[str, str]]:
    """`n` rows {question, answer} with distinct questions, the same for the same (n, seed,
    steps); steps: only the templates with that many solution steps (None: all of them,
    the shipped mix)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"number of rows is {n!r}; use a positive integer")
    templates = templates if steps is None else tuple(t for t in templates if t[0] in steps)
    if not templates:
        raise UsageError(f"no template has {steps} steps; the templates have 1 to 5")
    rng = random.Random(seed)
    rows: dict[str, str] = {}
    for _ in range(n * MAX_TRIES_PER_ROW):
        _, template = rng.choice(templates)
        question, lines, final = template(rng)
        if question not in rows:
            rows[question] = "\n".join(lines + [f"#### {final}"])
            if len(rows) == n:
                return [{"question": q, "answer": a} for q, a in rows.items()]
    raise UsageError(f"the templates give fewer than {n} distinct questions; ask for fewer rows")
