"""Summarise fewshot/gap/ablations.tsv over draws: each (config, head) row's mean dev accuracy
over the draws it has run on, and the paired differences between rows over the draws both
have, with a 95% bootstrap interval over draws (10,000 resamples, seed 0) and how many draws
the difference is positive on. The TSV holds one accuracy per run, not per-example
predictions, so the interval covers the spread between draws only. From the repository's root:

    python fewshot/gap/summarize.py
    python fewshot/gap/summarize.py --n 100 --pair "ce steps=250 b=16 lr=2e-05 pool=mean|head" \
        "ce steps=100 b=20 lr=5e-05 pool=mean|head"
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

# What docs/studies.md quotes: SetFit's update count against the grid's recipe for ce's own
# head, and a logistic regression refit on ce's frozen features against ce's own head.
GRID, SETFIT_UPDATES = (
    "ce steps=100 b=20 lr=5e-05 pool=mean",
    "ce steps=250 b=16 lr=2e-05 pool=mean",
)
DEFAULT_PAIRS = [
    (f"{SETFIT_UPDATES}|head", f"{GRID}|head"),
    (f"{GRID}|lr_raw", f"{GRID}|head"),
    (f"{SETFIT_UPDATES}|lr_raw", f"{SETFIT_UPDATES}|head"),
]


def read(tsv: Path, n: int) -> dict[str, dict[int, float]]:
    """{"<config>|<head>": {draw: dev accuracy x100}} for one N; a repeated row keeps its last."""
    rows: dict[str, dict[int, float]] = defaultdict(dict)
    with tsv.open() as fh:
        for r in csv.DictReader(fh, delimiter="\t"):
            if int(r["N"]) == n:
                rows[f"{r['config']}|{r['head']}"][int(r["draw"])] = float(r["dev_accuracy"])
    return dict(rows)


def paired(a: dict[int, float], b: dict[int, float], resamples: int = 10_000) -> dict:
    """A - B on the draws both have: mean, 95% percentile interval over resampled draws."""
    draws = sorted(a.keys() & b.keys())
    diff = np.array([a[d] - b[d] for d in draws])  # [D]
    rng = np.random.default_rng(0)
    means = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=1)  # [R]
    low, high = np.percentile(means, [2.5, 97.5])
    return {
        "draws": draws,
        "mean": diff.mean(),
        "low": low,
        "high": high,
        "positive": int((diff > 0).sum()),
        "min": diff.min(),
        "max": diff.max(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tsv", type=Path, default=Path("fewshot/gap/ablations.tsv"))
    p.add_argument("--n", type=int, default=100)
    p.add_argument(
        "--pair",
        nargs=2,
        action="append",
        metavar=("A", "B"),
        help='two "<config>|<head>" rows; repeatable (default: the pairs docs quote)',
    )
    a = p.parse_args()
    rows, pairs = read(a.tsv, a.n), a.pair or DEFAULT_PAIRS
    missing = [k for pair in pairs for k in pair if k not in rows]
    if missing:
        raise SystemExit(f"no rows for {missing[0]!r} at N = {a.n} in {a.tsv}: run ablate.py first")
    print(f"N = {a.n}: mean dev accuracy over draws\n\n| config | head | draws | mean |")
    print("| --- | --- | --- | --- |")
    for key in sorted(rows):
        config, head = key.split("|")
        draws = rows[key]
        print(f"| {config} | {head} | {len(draws)} | {np.mean(list(draws.values())):.2f} |")
    print("\n| A | B | draws | A - B [95% over draws] | A above B on | per draw |")
    print("| --- | --- | --- | --- | --- | --- |")
    for left, right in pairs:
        d = paired(rows[left], rows[right])
        left, right = left.replace("|", ", "), right.replace("|", ", ")  # a table cell
        print(
            f"| {left} | {right} | {len(d['draws'])} | {d['mean']:+.2f} [{d['low']:+.2f}, "
            f"{d['high']:+.2f}] | {d['positive']} of {len(d['draws'])} | "
            f"{d['min']:+.2f} to {d['max']:+.2f} |"
        )


if __name__ == "__main__":
    main()
