"""The words a verdict may use, from a difference's 95% interval (scores x1, not x100).

- **better** / **worse**: the interval excludes 0 (``paired.paired_bootstrap``'s rule);
- **comparable**: not better, and non-inferior at a margin fixed in advance: the interval's
  lower end above ``-MARGIN`` (CLAIMS.md, A1: "comparable" needs a margin; a null result
  with a wide interval is neither);
- **inconclusive**: none of these (the interval reaches below ``-MARGIN`` and above 0).

A comparison where every run sits on the majority class says nothing about the methods:
``uninformative`` marks it, whatever its interval (``on_majority``).
"""

from __future__ import annotations

from aclpipe.study.measures import ROUNDING

MARGIN = 0.01  # 1 point of score, fixed before any result (CLAIMS.md, A1)
BETTER, COMPARABLE, WORSE, INCONCLUSIVE = "better", "comparable", "worse", "inconclusive"
UNINFORMATIVE = "uninformative"


def verdict(low: float, high: float, margin: float = MARGIN) -> str:
    """better / comparable / worse / inconclusive, from a difference's interval."""
    if low > ROUNDING:
        return BETTER
    if high < -ROUNDING:
        return WORSE
    if low > -margin:
        return COMPARABLE
    return INCONCLUSIVE


def on_majority(low: float, majority: float) -> bool:
    """Whether a run's score interval reaches the majority-class score (or below): it is
    not told apart from predicting the most frequent class."""
    return low <= majority + ROUNDING
