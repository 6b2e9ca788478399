"""The one budget rule (aclpipe.early_exit.budget) against a plain reference written here: a
grid of sweeps with tied costs and tied scores, scores on a floor that rounds up, and missing
scores; and the three callers (export default, trade-off stage, studies' pick) agree with it."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

from aclpipe.early_exit.budget import BUDGETS, admits, budget_floor, cheapest_within


def plain_pick(scores, costs, reference, points):
    """A slow reference: exact fractions for the floor (the score a budget admits is at least
    reference - points/100, read as the decimal it was written as), then a scan that keeps the
    first cheapest, on equal cost the higher score."""
    floor = Fraction(str(reference)) - Fraction(points, 100)
    best = None
    for i, (score, cost) in enumerate(zip(scores, costs, strict=True)):
        if score is None or Fraction(str(score)) < floor:
            continue
        if best is None or cost < costs[best] or (cost == costs[best] and score > scores[best]):
            best = i
    return best


@pytest.mark.parametrize("seed", range(40))
def test_the_cheapest_within_matches_a_plain_scan(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    scores = [rng.choice([None, *(k / 100 for k in range(45, 91))]) for _ in range(n)]
    costs = [rng.choice([1 / 6, 2 / 6, 3 / 6, 5 / 6, 1.0]) for _ in range(n)]  # ties on purpose
    for reference, points in itertools.product((0.52, 0.8, 0.85, 0.9), BUDGETS):
        assert cheapest_within(scores, costs, reference, points) == plain_pick(
            scores, costs, reference, points
        ), (scores, costs, reference, points)


def test_a_score_on_the_floor_is_admitted_where_the_float_floor_rounds_up() -> None:
    assert 0.52 - 5 / 100 > 0.47  # 0.47000000000000003: the float floor is above the score
    assert budget_floor(0.52, 5) == 0.47
    assert admits(0.47, 0.52, 5) and not admits(0.4699, 0.52, 5) and not admits(None, 0.52, 5)
    assert cheapest_within([0.47, 0.52], [0.5, 1.0], 0.52, 5) == 0
    assert cheapest_within([0.40, 0.45], [0.5, 1.0], 0.52, 5) is None


def test_ties_go_to_the_higher_score_then_the_first() -> None:
    assert cheapest_within([0.79, 0.80, 0.80], [0.5, 0.5, 0.5], 0.8, 1) == 1
    assert cheapest_within([0.80, 0.80], [0.5, 0.5], 0.8, 0) == 0
