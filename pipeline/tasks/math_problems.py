"""MATH-format problems, generated from templates (pure Python, same rows per seed).

A row has the MATH data set's four columns:

    problem   "Solve for $x$: $3x - 4 = 11$."
    level     "Level 2"   (here: the number of steps of the solution, 1 to 5)
    type      "Algebra"   (one of MATH's subject names)
    solution  "Adding $4$ to both sides gives $3x = 15$. Dividing both sides by $3$ gives
               $x = \\boxed{5}$."

LaTeX in `$...$` and the final answer in the last `\\boxed{...}`, as MATH writes them:
whole numbers, negative numbers and common fractions in lowest terms. Two templates per
level, so solution lengths vary by template; numbers are small.
"""

from __future__ import annotations

import math
import random
from typing import Callable

from pipeline.errors import UsageError

MAX_TRIES_PER_ROW = 100  # distinct problems: give up when the templates run out


def frac(p: int, q: int) -> str:
    """p/q in lowest terms as MATH writes it: "\\frac{7}{2}", "-\\frac{1}{3}" or "4"."""
    g = math.gcd(p, q)
    p, q = p // g, q // g
    if q < 0:
        p, q = -p, -q
    if q == 1:
        return str(p)
    return f"-\\frac{{{-p}}}{{{q}}}" if p < 0 else f"\\frac{{{p}}}{{{q}}}"


def linear(a: int, b: int, var: str = "x") -> str:
    """"3x + 5", "3x - 5": the LaTeX of a*var + b."""
    return f"{a}{var} {'-' if b < 0 else '+'} {abs(b)}"


Problem = tuple[str, str, list[str]]  # (type, problem, solution sentences)


def _product(rng: random.Random) -> Problem:
    a, b = rng.randint(11, 40), rng.randint(3, 12)
    return ("Prealgebra", f"Compute ${a} \\times {b}$.",
            [f"${a} \\times {b} = \\boxed{{{a * b}}}$."])


def _remainder(rng: random.Random) -> Problem:
    m = rng.randint(3, 12)
    q, r = rng.randint(2, 30), rng.randint(1, m - 1)
    n = m * q + r
    return ("Number Theory", f"What is the remainder when ${n}$ is divided by ${m}$?",
            [f"Since ${n} = {m} \\cdot {q} + {r}$, the remainder is $\\boxed{{{r}}}$."])


def _solve_linear(rng: random.Random) -> Problem:
    a, x = rng.randint(2, 9), rng.randint(-9, 9)
    b = rng.choice([v for v in range(-12, 13) if v])
    c = a * x + b
    move = f"Subtracting ${b}$ from" if b > 0 else f"Adding ${-b}$ to"
    return ("Algebra", f"Solve for $x$: ${linear(a, b)} = {c}$.",
            [f"{move} both sides gives ${a}x = {c - b}$.",
             f"Dividing both sides by ${a}$ gives $x = \\boxed{{{x}}}$."])


def _perimeter(rng: random.Random) -> Problem:
    a, b = rng.randint(3, 20), rng.randint(2, 15)
    return ("Geometry", f"A rectangle has length ${a}$ and width ${b}$. What is its perimeter?",
            [f"The perimeter is $2({a} + {b})$, and ${a} + {b} = {a + b}$.",
             f"So the perimeter is $2 \\cdot {a + b} = \\boxed{{{2 * (a + b)}}}$."])


def _marbles(rng: random.Random) -> Problem:
    red, blue = rng.randint(1, 12), rng.randint(1, 12)
    total = red + blue
    answer = frac(red, total)
    return ("Counting & Probability",
            f"A bag holds ${red}$ red marbles and ${blue}$ blue marbles. One marble is drawn at "
            f"random. What is the probability that it is red? Express your answer as a common "
            f"fraction.",
            [f"There are ${red} + {blue} = {total}$ marbles in the bag.",
             f"Of these, ${red}$ are red.",
             f"So the probability is $\\frac{{{red}}}{{{total}}} = \\boxed{{{answer}}}$."])


def _triangle(rng: random.Random) -> Problem:
    a, b = rng.randint(2, 15), rng.randint(2, 15)
    answer = frac(a * b, 2)
    return ("Geometry", f"A right triangle has legs of length ${a}$ and ${b}$. What is its area?",
            ["The area of a right triangle is half the product of its legs.",
             f"The product of the legs is ${a} \\cdot {b} = {a * b}$.",
             f"Half of it is $\\frac{{{a * b}}}{{2}} = \\boxed{{{answer}}}$."])


def _add_fractions(rng: random.Random) -> Problem:
    a, b = rng.randint(1, 9), rng.randint(2, 9)
    c, d = rng.randint(1, 9), rng.randint(2, 9)
    den = math.lcm(b, d)
    p, q = a * den // b, c * den // d
    answer = frac(p + q, den)
    return ("Prealgebra",
            f"What is $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$? Express your answer as a "
            f"common fraction.",
            [f"The least common denominator of ${b}$ and ${d}$ is ${den}$.",
             f"So $\\frac{{{a}}}{{{b}}} = \\frac{{{p}}}{{{den}}}$ and "
             f"$\\frac{{{c}}}{{{d}}} = \\frac{{{q}}}{{{den}}}$.",
             f"Their sum is $\\frac{{{p} + {q}}}{{{den}}} = \\frac{{{p + q}}}{{{den}}}$.",
             f"In lowest terms this is $\\boxed{{{answer}}}$."])


def _compose(rng: random.Random) -> Problem:
    a, b = rng.randint(2, 6), rng.choice([v for v in range(-9, 10) if v])
    c, k = rng.randint(1, 9), rng.randint(-4, 4)
    g = k * k - c
    answer = a * g + b
    return ("Algebra",
            f"Let $f(x) = {linear(a, b)}$ and $g(x) = x^2 - {c}$. What is $f(g({k}))$?",
            [f"First, $g({k}) = ({k})^2 - {c} = {k * k} - {c} = {g}$.",
             f"So $f(g({k})) = f({g})$.",
             f"Then $f({g}) = {a} \\cdot ({g}) {'-' if b < 0 else '+'} {abs(b)}$.",
             f"That is ${a * g} {'-' if b < 0 else '+'} {abs(b)} = \\boxed{{{answer}}}$."])


def _series(rng: random.Random) -> Problem:
    first, step, n = rng.randint(1, 9), rng.randint(2, 6), rng.randint(5, 12)
    last = first + (n - 1) * step
    total = n * (first + last) // 2
    terms = ", ".join(str(first + i * step) for i in range(3))
    return ("Algebra",
            f"What is the sum of the first ${n}$ terms of the arithmetic sequence "
            f"${terms}, \\ldots$?",
            [f"The common difference is ${first + step} - {first} = {step}$.",
             f"The ${n}$th term is ${first} + {n - 1} \\cdot {step} = {last}$.",
             f"The sum is $\\frac{{{n}({first} + {last})}}{{2}}$.",
             f"Since ${first} + {last} = {first + last}$, this is "
             f"$\\frac{{{n} \\cdot {first + last}}}{{2}} = \\frac{{{n * (first + last)}}}{{2}}$.",
             f"So the sum is $\\boxed{{{total}}}$."])


def _vieta(rng: random.Random) -> Problem:
    r1 = rng.randint(1, 9)
    r2 = rng.choice([v for v in range(-6, 10) if v and v != -r1])  # no zero term
    s, p = r1 + r2, r1 * r2
    answer = s * s - 2 * p
    quadratic = f"x^2 {'-' if s >= 0 else '+'} {abs(s)}x {'-' if p < 0 else '+'} {abs(p)}"
    return ("Intermediate Algebra",
            f"Let $r_1$ and $r_2$ be the roots of ${quadratic} = 0$. What is $r_1^2 + r_2^2$?",
            [f"By Vieta's formulas, $r_1 + r_2 = {s}$.",
             f"Also by Vieta's formulas, $r_1 r_2 = {p}$.",
             "Now $r_1^2 + r_2^2 = (r_1 + r_2)^2 - 2 r_1 r_2$.",
             f"That is $({s})^2 - 2 \\cdot ({p}) = {s * s} - ({2 * p})$.",
             f"So $r_1^2 + r_2^2 = \\boxed{{{answer}}}$."])


Template = Callable[[random.Random], Problem]
# Two templates per level; a template's level is the number of sentences of its solution.
TEMPLATES: tuple[Template, ...] = (
    _product, _remainder, _solve_linear, _perimeter, _marbles, _triangle, _add_fractions,
    _compose, _series, _vieta,
)


def math_rows(n: int, seed: int) -> list[dict[str, str]]:
    """`n` rows {problem, level, type, solution} with distinct problems, the same for the
    same (n, seed)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"number of rows is {n!r}; use a positive integer")
    rng = random.Random(seed)
    rows: dict[str, dict[str, str]] = {}
    for _ in range(n * MAX_TRIES_PER_ROW):
        subject, problem, sentences = rng.choice(TEMPLATES)(rng)
        if problem not in rows:
            rows[problem] = {"problem": problem, "level": f"Level {len(sentences)}",
                             "type": subject, "solution": " ".join(sentences)}
            if len(rows) == n:
                return list(rows.values())
    raise UsageError(f"the templates give fewer than {n} distinct problems; ask for fewer rows")
