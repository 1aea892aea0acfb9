"""Procedurally generated, verifiable toy tasks for the embedded default.

The task shipped with verl is integer addition written the usual way: the user message is
``"<a>+<b>"`` (e.g. ``"347+85"``) and the correct assistant answer is the decimal sum (``"432"``).
Operands have between ``min_digits`` and ``max_digits`` digits (the number of digits of each operand
is drawn uniformly, then the value uniformly among numbers of that length), so one data set mixes easy
and hard problems: a half-trained model solves the short ones and fails the long ones with carries,
which is what group-relative RL needs (some groups all right, many mixed).

Rows follow the upstream verl RL schema::

    {"data_source": "verl_toy/addition",
     "prompt": [{"role": "user", "content": "347+85"}],
     "ability": "arithmetic",
     "reward_model": {"style": "rule", "ground_truth": "432"},
     "extra_info": {"split": "train", "index": 0, "a": 347, "b": 85, "answer": "432"}}

The same generator writes the SFT warm-up data (``prompt`` + ``response`` columns). Generation is a
pure function of ``(seed, split)``: train and test use disjoint random streams and the test set excludes
any problem that appears in the train set, so test accuracy measures generalisation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

ADDITION_DATA_SOURCE = "verl_toy/addition"


@dataclass(frozen=True)
class AdditionTask:
    """Parameters of the addition task.

    Attributes:
        min_digits: smallest number of digits of an operand (>= 1).
        max_digits: largest number of digits of an operand (>= min_digits).
    """

    min_digits: int = 1
    max_digits: int = 3

    def __post_init__(self):
        if not (1 <= self.min_digits <= self.max_digits <= 18):
            raise ValueError(
                f"AdditionTask needs 1 <= min_digits <= max_digits <= 18, got min_digits={self.min_digits}, "
                f"max_digits={self.max_digits}"
            )

    def sample_operand(self, rng: random.Random) -> int:
        n_digits = rng.randint(self.min_digits, self.max_digits)
        low = 0 if n_digits == 1 else 10 ** (n_digits - 1)
        return rng.randint(low, 10**n_digits - 1)

    def sample_problem(self, rng: random.Random) -> tuple[int, int]:
        return self.sample_operand(rng), self.sample_operand(rng)

    @staticmethod
    def question(a: int, b: int) -> str:
        return f"{a}+{b}"

    @staticmethod
    def answer(a: int, b: int) -> str:
        return str(a + b)

    @staticmethod
    def careless_answer(a: int, b: int) -> str:
        """The classic mistake: add column by column and drop every carry (47+85 -> "22").

        Equals ``answer(a, b)`` exactly when the problem has no carry.
        """
        out, place = 0, 1
        while a or b:
            out += ((a % 10 + b % 10) % 10) * place
            a, b, place = a // 10, b // 10, place * 10
        return str(out)

    @staticmethod
    def has_carry(a: int, b: int) -> bool:
        return AdditionTask.careless_answer(a, b) != AdditionTask.answer(a, b)

    def number_of_distinct_problems(self) -> int:
        per_operand = sum((10 if d == 1 else 9 * 10 ** (d - 1)) for d in range(self.min_digits, self.max_digits + 1))
        return per_operand * per_operand


def _split_seed(seed: int, split: str) -> int:
    # Distinct, stable streams per split without relying on Python's salted hash().
    return seed * 1_000_003 + sum((i + 1) * ord(c) for i, c in enumerate(split))


def generate_addition_problems(
    task: AdditionTask, n: int, seed: int, split: str, exclude: set[tuple[int, int]] | None = None
) -> list[tuple[int, int]]:
    """Draw ``n`` distinct problems ``(a, b)`` for ``split``, skipping any in ``exclude``.

    Raises ValueError when the task has too few distinct problems to satisfy the request.
    """
    exclude = exclude or set()
    available = task.number_of_distinct_problems() - len(exclude)
    if n > available:
        raise ValueError(
            f"asked for {n} distinct {split} problems but the task {task} has only {available} left "
            f"after excluding {len(exclude)}; raise max_digits or lower the count"
        )
    rng = random.Random(_split_seed(seed, split))
    seen: set[tuple[int, int]] = set()
    out: list[tuple[int, int]] = []
    while len(out) < n:
        ab = task.sample_problem(rng)
        if ab in seen or ab in exclude:
            continue
        seen.add(ab)
        out.append(ab)
    return out


def addition_rl_row(a: int, b: int, split: str, index: int) -> dict:
    """One RL row in the upstream schema (see module docstring)."""
    answer = AdditionTask.answer(a, b)
    return {
        "data_source": ADDITION_DATA_SOURCE,
        "prompt": [{"role": "user", "content": AdditionTask.question(a, b)}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "a": a, "b": b, "answer": answer},
    }


def addition_sft_row(a: int, b: int, split: str, index: int, careless: bool = False) -> dict:
    """One SFT row: the RL row plus a ``response`` column.

    The response is the correct sum, or the carry-dropping answer when ``careless`` (the imperfect
    teacher of the warm-up; see ``scripts/build_embedded_default.py``). ``extra_info.careless`` records
    which one was written.
    """
    row = addition_rl_row(a, b, split, index)
    row["response"] = AdditionTask.careless_answer(a, b) if careless else AdditionTask.answer(a, b)
    row["extra_info"]["careless"] = bool(careless)
    return row


def make_addition_splits(
    task: AdditionTask, n_train: int, n_test: int, seed: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Train and test problem lists, disjoint (test never repeats a train problem)."""
    test = generate_addition_problems(task, n_test, seed, "test")
    train = generate_addition_problems(task, n_train, seed, "train", exclude=set(test))
    return train, test


# ----------------------------------------------------------------------------------------------------
# calculator: multi-turn tool use (verl_toy/calculator)
# ----------------------------------------------------------------------------------------------------
CALCULATOR_DATA_SOURCE = "verl_toy/calculator"


@dataclass(frozen=True)
class CalculatorTask:
    """Products of an ``a_digits``-digit and a ``b_digits``-digit number (``"347*85"``), too hard for
    the tiny model to compute in its head; the `calculator` tool computes them.

    The policy either guesses (``"~31842"``, which scores 0) or calls the
    tool first, in the compact ``verl_toy`` format, and copies its result::

        user: 347*85
        assistant: <tool_call>calculator: 347*85</tool_call>
        tool: 29495
        assistant: =29495
    """

    a_digits: int = 3
    b_digits: int = 2
    # products below this are not drawn: with the default every result has 5 digits, so the answer
    # copies the tool's result from a fixed distance (a tiny model learns a fixed-offset copy fast;
    # with mixed 4/5-digit results it had not learned to copy after 1300 SFT steps)
    min_product: int = 10000

    def __post_init__(self):
        if not (1 <= self.a_digits <= 9 and 1 <= self.b_digits <= 9):
            raise ValueError(
                f"CalculatorTask needs 1..9 digits per operand, got a_digits={self.a_digits}, b_digits={self.b_digits}"
            )
        if self.number_of_distinct_problems() == 0:
            raise ValueError(
                f"CalculatorTask: no product of {self.a_digits} and {self.b_digits} digits reaches "
                f"min_product={self.min_product}"
            )

    @staticmethod
    def _range(digits: int) -> tuple[int, int]:
        return (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1

    def sample_problem(self, rng: random.Random) -> tuple[int, int]:
        while True:
            a, b = rng.randint(*self._range(self.a_digits)), rng.randint(*self._range(self.b_digits))
            if a * b >= self.min_product:
                return a, b

    def number_of_distinct_problems(self) -> int:
        lo_b, hi_b = self._range(self.b_digits)
        lo_a, hi_a = self._range(self.a_digits)
        total = 0
        for a in range(max(lo_a, 1), hi_a + 1):
            first_b = max(lo_b, -(-self.min_product // a))
            total += max(0, hi_b - first_b + 1)
        return total + (0 if lo_a > 0 or self.min_product > 0 else hi_b - lo_b + 1)

    @staticmethod
    def question(a: int, b: int) -> str:
        return f"{a}*{b}"

    @staticmethod
    def answer(a: int, b: int) -> str:
        return str(a * b)

    @staticmethod
    def tool_call(a: int, b: int) -> str:
        return f"<tool_call>calculator: {a}*{b}</tool_call>"

    @staticmethod
    def final(a: int, b: int) -> str:
        return f"={a * b}"

    @staticmethod
    def guess(a: int, b: int, rng: random.Random) -> str:
        """The teacher's answer without the tool: a guess of the product's length, written ``~31842``
        (never an exact ``=`` answer, so it scores 0). Its digits carry no information about the
        question, so the student does not build a competing "compute the digits" circuit, which
        blocked learning to copy the tool's result."""
        n = len(str(a * b))
        return "~" + str(rng.randint(10 ** (n - 1), 10**n - 1))


def calculator_rl_row(a: int, b: int, split: str, index: int) -> dict:
    """One RL row: upstream schema plus ``agent_name="tool_agent"`` and ``extra_info.tools_kwargs``."""
    answer = CalculatorTask.answer(a, b)
    return {
        "data_source": CALCULATOR_DATA_SOURCE,
        "prompt": [{"role": "user", "content": CalculatorTask.question(a, b)}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "agent_name": "tool_agent",
        "extra_info": {
            "split": split,
            "index": index,
            "a": a,
            "b": b,
            "answer": answer,
            "tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": answer}}},
        },
    }


def calculator_sft_row(
    a: int, b: int, split: str, index: int, use_tool: bool, rng: random.Random | None = None
) -> dict:
    """One multi-turn SFT row (``messages``): the teacher calls the tool and copies its result when
    ``use_tool``, else it guesses (``~31842``, see `CalculatorTask.guess`; `rng` seeds the guess).
    Keeping the exact ``=`` answer for copied results is what lets a tiny student learn to copy (a
    correct direct ``=`` answer, which it cannot compute, teaches it to guess digits after ``=``)."""
    q = CalculatorTask.question(a, b)
    if use_tool:
        messages = [
            {"role": "user", "content": q},
            {"role": "assistant", "content": CalculatorTask.tool_call(a, b)},
            {"role": "tool", "content": CalculatorTask.answer(a, b)},
            {"role": "assistant", "content": CalculatorTask.final(a, b)},
        ]
    else:
        rng = rng or random.Random(a * 1000 + b)
        messages = [{"role": "user", "content": q}, {"role": "assistant", "content": CalculatorTask.guess(a, b, rng)}]
    return {
        "messages": messages,
        "extra_info": {"split": split, "index": index, "a": a, "b": b, "use_tool": bool(use_tool)},
    }


def make_calculator_splits(
    task: CalculatorTask, n_train: int, n_test: int, seed: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Disjoint train / test problems (`generate_addition_problems` draws for any task with
    `sample_problem` and `number_of_distinct_problems`)."""
    test = generate_addition_problems(task, n_test, seed, "calc_test")
    train = generate_addition_problems(task, n_train, seed, "calc_train", exclude=set(test))
    return train, test
