"""Paired statistics over seeds and dev examples (docs/methods.md, "How a claim is judged"); pure NumPy.
The measures themselves (scores under weights, AUC, budgets) are ``measures``.

**Paired bootstrap** (``paired_bootstrap``): a claim "A beats B" on a measure uses the seeds
both runs have. Each of R resamples (at least 2,000 in reports) draws dev example counts
``w`` (one draw shared by every drawn seed and both methods: paired) and seed counts (the
seeds drawn with replacement), and takes the mean over drawn seeds of
``measure(A_s, w) - measure(B_s, w)``. Reported: the mean difference on the original data,
the 95% percentile interval, the one-sided p-value (share of resamples at or below 0), the
number of seeds, and the verdict: ``better`` / ``worse`` only when the interval excludes 0
(by more than float rounding, 1e-12), else ``no detectable difference``. With a single
common seed the same computation resamples examples only (drawing one seed from one is no
draw); the result says ``seeds: 1`` and reports mark it "1 seed: examples only", since the
interval then holds no seed-to-seed variation. Draws come from ``numpy.random.default_rng
(seed)``: example indices first, then seed indices, so a report is reproducible to the bit.

**Family-wise view** (``two_sided_p``, ``holm``): beside docs/methods.md's per-claim verdict, the
reports take a task's claims as one family and say which better/worse verdicts survive Holm's
correction; it adds a column and a sentence, it never changes a verdict.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from aclpipe.data.tasks import Task
from aclpipe.errors import UserError
from aclpipe.study.stats.measures import ROUNDING, Measure

RESAMPLES = 2000
LEVEL = 0.95


@functools.lru_cache(maxsize=16)
def draw(num_examples: int, num_seeds: int, resamples: int = RESAMPLES, seed: int = 0):
    """``(weights [R, N], seed_counts [R, n])``: how often each example and each seed is
    drawn in R resamples with replacement (indices drawn uniformly, example indices first,
    then counted). The same arguments give the same (read-only, cached) arrays."""
    rng = np.random.default_rng(seed)
    out = []
    for size in (num_examples, num_seeds):
        index = rng.integers(0, size, (resamples, size))  # [R, size]
        flat = (index + size * np.arange(resamples)[:, None]).ravel()
        counts = np.bincount(flat, minlength=resamples * size).reshape(resamples, size)
        counts.setflags(write=False)
        out.append(counts)
    return out[0], out[1]


def resampled_differences(
    task: Task,
    a: Sequence[Measure],
    b: Sequence[Measure] | None,
    labels: np.ndarray,
    weights: np.ndarray,
    seed_counts: np.ndarray,
) -> np.ndarray:
    """``[R]``: per resample, the mean over drawn seeds of ``a_s - b_s`` (of ``a_s`` alone
    when ``b`` is None). ``a[i]``, ``b[i]``: the i-th seed's measures; ``weights [R, N]``;
    ``seed_counts [R, n]`` how often each seed was drawn."""
    per_seed = []
    for i, ma in enumerate(a):
        value = ma.values(task, labels, weights)
        per_seed.append(value - b[i].values(task, labels, weights) if b is not None else value)
    stacked = np.stack(per_seed, axis=1)  # [R, n]
    return (seed_counts * stacked).sum(axis=1) / seed_counts.sum(axis=1)


def resample(
    task: Task,
    a: Sequence[Measure],
    b: Sequence[Measure] | None,
    labels: np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> np.ndarray:
    """``[R]``: ``resampled_differences`` over R resamples of the examples and the seeds
    (``draw``): the bootstrap of A - B (of A alone when ``b`` is None), one seed per entry."""
    weights, seed_counts = draw(len(labels), len(a), resamples, seed)
    return resampled_differences(task, a, b, labels, weights, seed_counts)


def percentile_interval(values: np.ndarray, level: float) -> tuple[float, float]:
    low, high = np.quantile(values, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(low), float(high)


def check_same_examples(
    runs: Sequence[tuple[object, np.ndarray, Mapping | None]], split: str, fix: str
) -> None:
    """Runs compared example by example must have scored the same examples: each
    ``(name, labels, data record)`` has the first run's ``split`` labels in the same order
    and its data record (run.json ``data``: source, tokenizer, max_length, subsample and
    split seed, each split's size, label counts, mean length and truncation). One line
    naming the odd run, the first run and ``fix`` if not."""
    if not runs:
        return
    first, first_labels, first_data = runs[0]
    for name, labels, data in runs[1:]:
        if not np.array_equal(labels, first_labels):
            raise UserError(f"{name} scored other {split} examples than {first}: {fix}")
        mine, theirs = data or {}, first_data or {}
        if mine != theirs:
            keys = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
            raise UserError(
                f"{name} was trained on other data than {first} (run.json 'data' differs in "
                f"{', '.join(keys)}): {fix}"
            )


def paired_bootstrap(
    task: Task,
    a: Mapping[int, Measure],
    b: Mapping[int, Measure],
    labels: np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> dict:
    """The claim "A beats B" on one measure, over the seeds both have (``{seed: Measure}``).

    Returns ``{"seeds", "difference", "low", "high", "p", "p_two_sided", "verdict",
    "resamples"}``;
    ``difference`` is on the original data; ``p`` the share of resamples at or below 0;
    ``p_two_sided`` (``two_sided_p``) is for the family-wise view only.
    Without a common seed: ``{"seeds": [], "verdict": "no common seed"}``.
    """
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return {"seeds": [], "verdict": "no common seed"}
    original, diffs = bootstrap_differences(task, a, b, labels, resamples, seed)
    low, high = percentile_interval(diffs, level)
    if low > ROUNDING:
        verdict = "better"
    elif high < -ROUNDING:
        verdict = "worse"
    else:
        verdict = "no detectable difference"
    return {
        "seeds": seeds,
        "difference": original,
        "low": low,
        "high": high,
        "p": float(np.mean(diffs <= ROUNDING)),
        "p_two_sided": two_sided_p(diffs),
        "verdict": verdict,
        "resamples": resamples,
    }


def bootstrap_differences(
    task: Task,
    a: Mapping[int, Measure],
    b: Mapping[int, Measure],
    labels: np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, np.ndarray]:
    """``(difference on the original data, resampled differences [R])`` of A - B over the
    seeds both have (at least one), as ``paired_bootstrap`` draws them."""
    seeds = sorted(set(a) & set(b))
    ranges = {m.cost_range for m in (*a.values(), *b.values())}
    if len(ranges) > 1:  # areas over other cost ranges are other means: not comparable
        raise UserError(
            "the runs' AUCs span different cost ranges "
            f"({', '.join(f'{lo:.3f}-{hi:.3f}' for lo, hi in sorted(ranges))}): "
            "compare runs with the same exits (model.exits)"
        )
    labels = np.asarray(labels)
    ones = np.ones((1, len(labels)))
    a_s, b_s = [a[s] for s in seeds], [b[s] for s in seeds]
    original = resampled_differences(task, a_s, b_s, labels, ones, np.ones((1, len(seeds))))
    return float(original[0]), resample(task, a_s, b_s, labels, resamples, seed)


def two_sided_p(diffs: np.ndarray) -> float:
    """The two-sided bootstrap p-value of "A - B = 0", for the family-wise view (``holm``):
    twice the smaller tail, each tail counted as ``(k + 1) / (R + 1)`` (k resamples at or
    beyond 0 on that side, R resamples), capped at 1. The +1 keeps it above 0: a tail no
    resample reached says p < 1/R, not p = 0, and Holm multiplies it (the +1 is exact for
    permutation p, Phipson and Smyth 2010; for bootstrap resamples it is a conservative
    convention). Resamples equal to 0 count in both tails, so identical runs give 1."""
    r = len(diffs)
    tail = min(int(np.sum(diffs <= ROUNDING)), int(np.sum(diffs >= -ROUNDING)))
    return min(1.0, 2 * (tail + 1) / (r + 1))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: sorted ascending, the j-th
    smallest (j from 0) becomes ``(m - j) * p``, made non-decreasing along the order and
    capped at 1. A claim holds family-wise at level a when its adjusted p is at most a;
    valid under any dependence between the claims (Holm, 1979)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: (p_values[i], i))
    adjusted = [0.0] * m
    running = 0.0
    for j, i in enumerate(order):
        running = max(running, min(1.0, (m - j) * p_values[i]))
        adjusted[i] = running
    return adjusted


def seed_mean_interval(
    task: Task,
    runs: Mapping[int, Measure],
    labels: np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> dict:
    """One run's measure over its seeds: ``{"mean", "sd", "low", "high", "n"}``; ``sd`` is
    the sample standard deviation over seeds (None below 2), the interval the bootstrap over
    seeds and examples as in ``paired_bootstrap``."""
    seeds = sorted(runs)
    if not seeds:
        return {"mean": None, "sd": None, "low": None, "high": None, "n": 0}
    labels = np.asarray(labels)
    per_seed = [float(runs[s].values(task, labels, np.ones((1, len(labels))))[0]) for s in seeds]
    values = resample(task, [runs[s] for s in seeds], None, labels, resamples, seed)
    low, high = percentile_interval(values, level)
    return {
        "mean": float(np.mean(per_seed)),
        "sd": float(np.std(per_seed, ddof=1)) if len(seeds) > 1 else None,
        "low": low,
        "high": high,
        "n": len(seeds),
    }


def exit_bands(
    task: Task,
    predictions: Mapping[int, np.ndarray],
    labels: np.ndarray,
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> list[dict]:
    """Per exit, the score over seeds with its 95% interval (``seed_mean_interval`` of each
    exit): ``predictions`` maps a seed to its ``[E, N]`` dev predictions."""
    width = len(next(iter(predictions.values())))
    return [
        seed_mean_interval(
            task,
            {s: Measure("final", p[e : e + 1]) for s, p in predictions.items()},
            labels,
            resamples,
            seed,
            level,
        )
        for e in range(width)
    ]
