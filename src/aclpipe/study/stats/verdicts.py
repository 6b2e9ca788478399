"""Verdicts as the papers word their claims (docs/claims.md; docs/methods.md, "How a claim is judged").

A comparison "A against B" on one measure is judged from its paired-bootstrap differences
(``paired.bootstrap_differences``: R resampled mean differences A - B over the seeds both
have). Every p here is one convention: the bootstrap tail ``(k + 1) / (R + 1)``, k the
resamples on the wrong side of the tested bound (the +1 keeps a tail no resample reached at
p < 1/R rather than 0), one-sided, read against ``alpha`` = 2.5%, the level at which a 95%
two-sided percentile interval excludes the bound. Three tests, one p each:

- *better*: ``p_better``, the resamples at or below 0;
- *worse*: ``p_worse``, the resamples at or above 0;
- *comparable (non-inferior)*: ``p_comparable``, the resamples at or below ``-margin``, the
  margin fixed in advance (campaign.verdicts.margin): A is no worse than B by the margin.

The verdict is the first of better, worse, comparable whose p is at most ``alpha``, else
*inconclusive*; the printed p is the verdict's own (an inconclusive line prints the p of the
claim's own test: superiority for a claim that A beats B, non-inferiority for one that A
"outperforms or performs comparably"). A claim *holds* when its verdict is better, or, for a
claim worded "or performs comparably", comparable. The same p enters Holm's step-down over a
task's family (``family``), each adjusted p with its Monte Carlo error (the binomial error
of a tail share estimated from R resamples, scaled by Holm's multiplier), so a reader sees
whether more resamples could move it across ``alpha``.

Two cases get no verdict: a task whose ce does not beat the majority class (``majority``: the
same bootstrap, ce against a constant guess) is *uninformative*; its comparisons are shown,
marked, and left out of every family and summary. A gradient-rule comparison whose rule
altered under ``rule_floor`` of the training steps (campaign.verdicts.rule_floor) is *rule not
exercised*: it tests nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from aclpipe.errors import UserError
from aclpipe.study.stats.measures import ROUNDING

ALPHA = 0.025  # one-sided; a 95% two-sided interval excludes the bound at this level
SUPERIORITY = "superiority"  # "A beats B": holds when better
NON_INFERIORITY = "non-inferiority"  # "A outperforms or performs comparably": better or comparable
KINDS = (SUPERIORITY, NON_INFERIORITY)
VERDICTS = ("better", "worse", "comparable", "inconclusive")
NOT_EXERCISED = "rule not exercised"


@dataclass(frozen=True)
class Rules:
    """campaign.verdicts: fixed in advance in campaign/params.yaml."""

    margin: float = 0.01  # non-inferiority margin, as a score fraction (1 point)
    resamples: int = 10000  # bootstrap resamples of every claim
    rule_floor: float = 0.01  # a gradient rule that altered fewer steps was not exercised
    alpha: float = ALPHA


def rules_from(spec: dict | None, where: str) -> Rules:
    """``campaign.verdicts`` ({margin: points, resamples, rule_floor: share}) as ``Rules``."""
    spec = dict(spec or {})
    unknown = set(spec) - {"margin", "resamples", "rule_floor"}
    if unknown:
        raise UserError(f"unknown key {sorted(unknown)[0]} in {where}: use margin, resamples, rule_floor")
    margin, resamples = spec.get("margin", 1.0), spec.get("resamples", 10000)
    floor = spec.get("rule_floor", 0.01)
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0 < margin < 100:
        raise UserError(f"{where}: margin must be points between 0 and 100, got {margin!r}")
    if not isinstance(resamples, int) or isinstance(resamples, bool) or resamples < 2000:
        raise UserError(f"{where}: resamples must be a whole number of at least 2000, got {resamples!r}")
    if not isinstance(floor, (int, float)) or isinstance(floor, bool) or not 0 <= floor < 1:
        raise UserError(f"{where}: rule_floor must be a share in [0, 1), got {floor!r}")
    return Rules(margin / 100, resamples, float(floor))


def tail(diffs: np.ndarray, bound: float, below: bool) -> float:
    """``(k + 1) / (R + 1)``: k resamples at or below ``bound`` (``below``), else at or above
    it (float rounding, 1e-12, counts as on the bound)."""
    diffs = np.asarray(diffs, dtype=np.float64)
    k = np.sum(diffs <= bound + ROUNDING) if below else np.sum(diffs >= bound - ROUNDING)
    return float((int(k) + 1) / (len(diffs) + 1))


def mc_error(p: float, resamples: int) -> float:
    """The Monte Carlo standard error of a tail share estimated from ``resamples`` draws."""
    return math.sqrt(p * (1 - p) / resamples)


def judge(diffs: np.ndarray, kind: str, rules: Rules) -> dict:
    """The verdict of one comparison from its resampled differences ``[R]`` (see the module
    docstring): ``{"verdict", "p", "holds", "p_better", "p_worse", "p_comparable",
    "mc_error", "margin"}``."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: use one of {', '.join(KINDS)}")
    p = {
        "better": tail(diffs, 0.0, below=True),
        "worse": tail(diffs, 0.0, below=False),
        "comparable": tail(diffs, -rules.margin, below=True),
    }
    verdict = next((v for v in ("better", "worse", "comparable") if p[v] <= rules.alpha), None)
    own = "better" if kind == SUPERIORITY else "comparable"
    shown = p[verdict or own]
    holds = verdict == "better" or (kind == NON_INFERIORITY and verdict == "comparable")
    return {
        "verdict": verdict or "inconclusive",
        "p": shown,
        "holds": holds,
        "p_better": p["better"],
        "p_worse": p["worse"],
        "p_comparable": p["comparable"],
        "mc_error": mc_error(shown, len(diffs)),
        "margin": rules.margin,
    }


def detectable(low: float, high: float) -> float:
    """The largest difference, either way, that a 95% interval ``[low, high]`` leaves
    possible: a null reads "no difference larger than this"."""
    return max(abs(low), abs(high))


def exercised(altered: Sequence[bool], floor: float) -> tuple[float, bool]:
    """The share of training steps a gradient rule altered, and whether it reaches ``floor``."""
    share = float(np.mean(altered)) if len(altered) else 0.0
    return share, share >= floor


def family(claims: Sequence[dict], rules: Rules, resamples: int) -> None:
    """Holm's step-down over ``claims`` (each with ``p``), in place: ``holm_p``, its Monte Carlo
    error ``holm_mc_error`` (the error of the p that sets it, times Holm's multiplier there),
    and ``family_wise``: the verdict holds family-wise (adjusted p at most alpha). Valid under
    any dependence between the claims (Holm 1979)."""
    m = len(claims)
    order = sorted(range(m), key=lambda i: (claims[i]["p"], i))
    running, source = 0.0, None
    for j, i in enumerate(order):
        value = min(1.0, (m - j) * claims[i]["p"])
        if source is None or value > running:
            running, source = value, (i, m - j)
        c = claims[i]
        c["holm_p"] = running
        origin, factor = source
        c["holm_mc_error"] = factor * mc_error(claims[origin]["p"], resamples)
        c["family_wise"] = c["verdict"] in ("better", "worse", "comparable") and running <= rules.alpha


def stable(p: float, error: float, alpha: float = ALPHA, sigmas: float = 3.0) -> bool:
    """Whether a p estimated with Monte Carlo ``error`` lies more than ``sigmas`` errors from
    ``alpha``: more resamples would not move it across."""
    return abs(p - alpha) > sigmas * error


# Words the few-shot study's tables add (aclpipe.study.fewshot.report): a spread ratio whose
# interval straddles 1, and a comparison where neither run beats the majority class.
INCONCLUSIVE, UNINFORMATIVE = "inconclusive", "uninformative"
