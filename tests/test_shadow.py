"""The shadow sampler's draws and compute bound, and observations against ``policies``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aclpipe.early_exit.policies import leaves
from aclpipe.early_exit.shadow import ShadowSampler, observe
from aclpipe.errors import UserError


def softmax(row: list[float]) -> list[float]:
    exp = [math.exp(v) for v in row]
    return [e / sum(exp) for e in exp]


@pytest.mark.parametrize("classes", [2, 3, 5])
def test_observation_scores_decide_as_the_policies_do(classes: int) -> None:
    rng = np.random.default_rng(classes)
    logits = rng.normal(0, 3, (6, classes))  # [E, C]: one record at six exits
    seen = observe(logits, 2)
    rows = logits.tolist()
    for k, row in enumerate(rows):
        p = softmax(row)
        assert seen.labels[k] == int(np.argmax(row))
        assert seen.confidence[k] == pytest.approx(max(p))
        assert seen.entropy[k] == pytest.approx(-sum(q * math.log(q) for q in p))
        for threshold in (0.3, 0.5, 0.9, seen.confidence[k]):  # the tie too: >= on both sides
            assert (seen.confidence[k] >= threshold) == leaves("confidence", threshold, [row],
                                                               False, 0.1)  # fmt: skip
        for threshold in (0.1, 0.5, seen.entropy[k]):
            assert (seen.entropy[k] < threshold) == leaves("entropy", threshold, [row], False, 0.1)
        for t in range(1, 6):  # patience t leaves at k when the run before k is t long
            assert (seen.runs()[k] >= t) == leaves("patience", t, rows[: k + 1], False, 0.1)
    assert seen.agrees() == [label == seen.labels[-1] for label in seen.labels]
    assert seen.agreed == (seen.labels[2] == seen.labels[-1])
    assert seen.scores("entropy") == seen.entropy and seen.scores("confidence") == seen.confidence


def test_observe_refuses_an_exit_the_record_lacks() -> None:
    with pytest.raises(UserError, match="outside"):
        observe(np.zeros((3, 2)), 3)


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.1, 0.5, 1.0])
def test_draws_are_the_fraction_and_repeatable(fraction: float) -> None:
    def picks(seed: int) -> list[bool]:
        sampler = ShadowSampler(fraction, share=1.0, burst=1e9, seed=seed)
        return [sampler.pick() for _ in range(20000)]

    first = picks(0)
    assert first == picks(0)
    share = sum(first) / len(first)
    assert abs(share - fraction) <= 4 * math.sqrt(fraction * (1 - fraction) / 20000) + 1e-12


@pytest.mark.parametrize(("share", "burst"), [(0.0, 0.0), (0.05, 2.0), (0.2, 10.0), (1.0, 0.5)])
def test_shadow_work_stays_within_its_share(share: float, burst: float) -> None:
    rng = np.random.default_rng(1)
    sampler = ShadowSampler(0.5, share=share, burst=burst, seed=3)
    largest = 0.0
    for served, early in zip(rng.uniform(1, 6, 5000), rng.random(5000) < 0.7):
        if sampler.pick() and early:  # a record run to the end costs nothing more
            cost = float(rng.uniform(1, 5))
            sampler.charge(cost)
            largest = max(largest, cost)
        sampler.served(float(served))
        assert sampler.shadow_cost <= share * sampler.served_cost + burst + largest + 1e-9
    assert sampler.drawn >= sampler.refused
    if share == 0.0:
        assert sampler.shadow_cost == 0.0 and sampler.refused == sampler.drawn


def test_refusal_never_changes_which_records_are_drawn() -> None:
    """The budget thins the draws; it never moves them (the sample stays uniform)."""
    rich, poor = ShadowSampler(0.3, 1.0, 1e9, seed=5), ShadowSampler(0.3, 0.01, 1.0, seed=5)
    rich_picks, poor_picks = [], []
    for _ in range(3000):
        rich_picks.append(rich.pick())
        poor_picks.append(poor.pick())
        for sampler, picked in ((rich, rich_picks[-1]), (poor, poor_picks[-1])):
            if picked:
                sampler.charge(3.0)
            sampler.served(2.0)
    assert all(r for r, p in zip(rich_picks, poor_picks) if p)  # poor's picks are rich's
    assert poor.drawn == rich.drawn and poor.refused > 0 and rich.refused == 0


@pytest.mark.parametrize(("fraction", "share", "burst"), [(1.5, 0.1, 1), (0.1, -1, 1),
                                                          (0.1, 0.1, -1)])  # fmt: skip
def test_bad_knobs_are_one_line_errors(fraction: float, share: float, burst: float) -> None:
    with pytest.raises(UserError):
        ShadowSampler(fraction, share, burst)
