"""Each verdict rule on hand-made resampled differences (aclpipe.study.stats.verdicts), against
plain counts written here; and a campaign report's verdicts from runs in a temp folder."""

from __future__ import annotations

import numpy as np
import pytest

from aclpipe.errors import UserError
from aclpipe.study.stats import verdicts
from aclpipe.study.stats.verdicts import NON_INFERIORITY, SUPERIORITY, Rules

RULES = Rules(margin=0.01, resamples=999, rule_floor=0.01)


def spread(centre: float, half: float, n: int = 999) -> np.ndarray:
    """``n`` differences evenly over ``[centre - half, centre + half]`` (score fractions)."""
    return np.linspace(centre - half, centre + half, n)


def plain_tail(diffs: np.ndarray, bound: float, below: bool) -> float:
    k = sum(1 for d in diffs if (d <= bound + 1e-12 if below else d >= bound - 1e-12))
    return (k + 1) / (len(diffs) + 1)


@pytest.mark.parametrize(
    ("centre", "half", "kind", "verdict", "holds"),
    [
        (0.02, 0.015, SUPERIORITY, "better", True),  # all above 0
        (0.02, 0.015, NON_INFERIORITY, "better", True),
        (-0.02, 0.015, SUPERIORITY, "worse", False),  # all below 0
        (-0.02, 0.015, NON_INFERIORITY, "worse", False),
        (0.0, 0.008, NON_INFERIORITY, "comparable", True),  # straddles 0, above -1 point
        (0.0, 0.008, SUPERIORITY, "comparable", False),  # comparable, but "beats" needs better
        (0.0, 0.03, NON_INFERIORITY, "inconclusive", False),  # reaches below -1 point
        (0.0, 0.03, SUPERIORITY, "inconclusive", False),
    ],
)
def test_each_verdict_on_hand_made_differences(centre, half, kind, verdict, holds) -> None:
    diffs = spread(centre, half)
    got = verdicts.judge(diffs, kind, RULES)
    assert got["verdict"] == verdict and got["holds"] is holds
    assert got["p_better"] == pytest.approx(plain_tail(diffs, 0.0, True))
    assert got["p_worse"] == pytest.approx(plain_tail(diffs, 0.0, False))
    assert got["p_comparable"] == pytest.approx(plain_tail(diffs, -0.01, True))
    # the printed p is the verdict's own; inconclusive prints the claim's own test
    own = {"better": "p_better", "worse": "p_worse", "comparable": "p_comparable"}
    key = own.get(verdict, "p_better" if kind == SUPERIORITY else "p_comparable")
    assert got["p"] == got[key]
    assert got["mc_error"] == pytest.approx(np.sqrt(got["p"] * (1 - got["p"]) / len(diffs)))


def test_tail_counts_by_hand_and_never_zero() -> None:
    diffs = np.array([-0.02, -0.01, 0.0, 0.01, 0.03])
    assert verdicts.tail(diffs, 0.0, below=True) == pytest.approx(4 / 6)  # -0.02, -0.01, 0 + 1
    assert verdicts.tail(diffs, 0.0, below=False) == pytest.approx(4 / 6)  # 0, 0.01, 0.03 + 1
    assert verdicts.tail(diffs, -0.01, below=True) == pytest.approx(3 / 6)
    assert verdicts.tail(np.full(9, 0.5), 0.0, below=True) == pytest.approx(1 / 10)


def test_identical_runs_are_comparable_not_better() -> None:
    got = verdicts.judge(np.zeros(999), NON_INFERIORITY, RULES)
    assert got["verdict"] == "comparable" and got["p_better"] == 1.0 and got["p_worse"] == 1.0


def test_the_margin_decides_comparable() -> None:
    diffs = spread(0.0, 0.015)  # lower end -1.5 points
    assert verdicts.judge(diffs, NON_INFERIORITY, RULES)["verdict"] == "inconclusive"
    wide = Rules(margin=0.02, resamples=999)
    assert verdicts.judge(diffs, NON_INFERIORITY, wide)["verdict"] == "comparable"


def test_detectable_and_rule_exercised() -> None:
    assert verdicts.detectable(-0.012, 0.034) == 0.034
    assert verdicts.detectable(-0.05, 0.01) == 0.05
    share, used = verdicts.exercised([False] * 995 + [True] * 5, 0.01)
    assert share == 0.005 and not used  # 0.5% of steps: not exercised
    share, used = verdicts.exercised([False] * 98 + [True] * 2, 0.01)
    assert share == 0.02 and used
    assert verdicts.exercised([], 0.01) == (0.0, False)


def test_family_holm_with_errors_against_a_plain_reference() -> None:
    ps = [0.004, 0.001, 0.02, 0.3]
    claims = [{"p": p, "verdict": "better"} for p in ps]
    verdicts.family(claims, RULES, 10000)
    # plain Holm: sorted 0.001, 0.004, 0.02, 0.3 times 4, 3, 2, 1, running max
    expected = {0.001: 0.004, 0.004: 0.012, 0.02: 0.04, 0.3: 0.3}
    for c in claims:
        assert c["holm_p"] == pytest.approx(expected[c["p"]])
        assert c["family_wise"] is (expected[c["p"]] <= 0.025)
    # each error: Holm's multiplier times the binomial error of the p that sets it
    by_p = {c["p"]: c for c in claims}
    assert by_p[0.004]["holm_mc_error"] == pytest.approx(3 * np.sqrt(0.004 * 0.996 / 10000))
    assert by_p[0.3]["holm_mc_error"] == pytest.approx(1 * np.sqrt(0.3 * 0.7 / 10000))
    # an inconclusive claim never holds family-wise, whatever its adjusted p
    lone = [{"p": 0.001, "verdict": "inconclusive"}]
    verdicts.family(lone, RULES, 10000)
    assert lone[0]["family_wise"] is False


def test_stable_means_three_errors_from_the_level() -> None:
    assert verdicts.stable(0.01, 0.002)
    assert not verdicts.stable(0.02, 0.002)  # 0.005 from 0.025: 2.5 errors
    assert verdicts.stable(0.04, 0.004)


def test_rules_from_the_campaign_file() -> None:
    assert verdicts.rules_from({"margin": 1.0, "resamples": 10000}, "x") == Rules(0.01, 10000)
    with pytest.raises(UserError, match="unknown key level"):
        verdicts.rules_from({"level": 0.9}, "campaign.verdicts")
    with pytest.raises(UserError, match="at least 2000"):
        verdicts.rules_from({"resamples": 100}, "campaign.verdicts")
    with pytest.raises(UserError, match="margin must be points"):
        verdicts.rules_from({"margin": -1}, "campaign.verdicts")
