"""The budget rule, written once: of the exit settings whose score is within ``b`` points of a
reference score, the cheapest (ties: the higher score, then the first listed).

A budget of ``b`` points (x100: 1 point is 0.01 of accuracy) admits a score at or above
``reference - b / 100`` (``budget_floor``); "cheapest" is the lowest expected time ratio (mean
exit layer / number of layers), the same as the highest layer speed-up. Three callers, one
rule: the export's default setting (``aclpipe.early_exit.settings``, ``BUDGET_POINTS``), the
pipeline's trade-off stage (``aclpipe.stages.tradeoff``, every budget of ``BUDGETS``) and the
studies' budget picks (``aclpipe.study.stats.measures.budget_pick``). Torch-free, as the
serving path reads the export's choice.
"""

from __future__ import annotations

from collections.abc import Sequence

BUDGETS = (0, 1, 2, 5)  # the budgets the trade-off report and the studies tabulate (points)
BUDGET_POINTS = 1  # the export's default setting keeps the score within 1 point of ce's
# A score equal to the budget's floor is admitted even when ``reference - b / 100`` rounds up.
TOLERANCE = 1e-9


def budget_floor(reference: float, points: float) -> float:
    """The lowest score a budget of ``points`` admits: 0.79 for 0.80 and 1, not
    0.7900000000000001."""
    return round(reference - points / 100, 10)


def admits(score: float | None, reference: float, points: float) -> bool:
    """Whether ``score`` is within ``points`` points of ``reference``."""
    return score is not None and score >= budget_floor(reference, points) - TOLERANCE


def cheapest_within(
    scores: Sequence[float | None], costs: Sequence[float], reference: float, points: float
) -> int | None:
    """The index of the cheapest setting the budget admits (``costs``: each setting's expected
    time ratio, or anything ordered as it, e.g. ``1 / layer_speedup``); ties go to the higher
    score, then to the first. None when no score is within the budget."""
    admitted = [i for i, score in enumerate(scores) if admits(score, reference, points)]
    # every admitted score is a number (admits refuses None)
    return min(admitted, key=lambda i: (costs[i], -(scores[i] or 0.0), i), default=None)
