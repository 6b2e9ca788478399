"""Few-shot training sets: a class-stratified draw of N training examples.

``prepare`` calls :func:`draw_fewshot` when ``data.fewshot_examples`` is set. The draw comes
from the training split *after* the validation split is held out (``carve_validation``), so
it never shares an example with that split, and it is made by its own seed,
``data.fewshot_seed`` (a few-shot study sets it to ``train.seed``: a draw is one seed, as the
several draws of Gunel et al. 2020 are). The held-out validation split is then not written:
with N labelled examples there is no honest validation split to select on, so a few-shot run
selects nothing and is scored on dev once.

Stratified: each class keeps its share of the training split, ``N * n_c / n`` rounded by
largest remainder (ties to the lower class index); regression scores are stratified by
quintile, as the validation split is. The rounding never asks a class for more examples than
it has, so a draw fails only when N exceeds the split, or when N is too small to give every
class at least one example: a SupCon anchor needs a positive of its class.

The draw is recorded in the prepared data's meta.json (``fewshot``: N, seed, the per-class
counts and the ids: 0-based rows of the task's training file, header not counted, or of the
hub's train split), which every run copies into its own record.
"""

from __future__ import annotations

import random

from aclpipe.data.config import DataConfig
from aclpipe.data.glue_sources import Example
from aclpipe.data.tasks import Task
from aclpipe.errors import UserError


def strata(task: Task, examples: list[Example]) -> list[int]:
    """Each example's stratum: its class, or its quintile of the score for regression."""
    if not task.is_regression:
        return [int(e.label) for e in examples]
    scores = sorted(float(e.label) for e in examples)
    cuts = [scores[len(scores) * q // 5] for q in range(1, 5)]
    return [sum(float(e.label) >= c for c in cuts) for e in examples]


def allocate(n: int, sizes: dict[int, int]) -> dict[int, int]:
    """``{stratum: draws}``: ``n`` shared out in proportion to ``sizes`` (largest remainder,
    ties to the lower stratum); never more than a stratum holds when ``n <= sum(sizes)``."""
    total = sum(sizes.values())
    exact = {s: n * size / total for s, size in sizes.items()}
    out = {s: int(x) for s, x in exact.items()}
    by_remainder = sorted(sizes, key=lambda s: (-(exact[s] - out[s]), s))
    for s in by_remainder[: n - sum(out.values())]:
        out[s] += 1
    return out


def stratified_ids(task: Task, pool: list[Example], n: int, seed: int) -> list[int]:
    """Positions in ``pool`` of a stratified draw of ``n`` (ascending); one-line errors for
    an ``n`` the pool cannot give."""
    what = "class" if not task.is_regression else "score quintile"
    if n > len(pool):
        raise UserError(
            f"data.fewshot_examples is {n} but {task.name}'s training split has {len(pool)} "
            "examples once the validation split is held out: draw at most that many"
        )
    groups: dict[int, list[int]] = {}
    for i, stratum in enumerate(strata(task, pool)):
        groups.setdefault(stratum, []).append(i)
    counts = allocate(n, {s: len(members) for s, members in groups.items()})
    empty = sorted(s for s, k in counts.items() if k == 0)
    if empty:
        name = task.labels[empty[0]] if not task.is_regression else str(empty[0])
        raise UserError(
            f"data.fewshot_examples is {n}: too few for a stratified draw to give {task.name}'s "
            f"{what} {name!r} an example ({len(groups[empty[0]])} of {len(pool)} in the "
            f"split); draw at least {_smallest_n(groups, len(pool))}"
        )
    rng = random.Random(seed)
    drawn = [i for s in sorted(groups) for i in rng.sample(groups[s], counts[s])]
    return sorted(drawn)


def _smallest_n(groups: dict[int, list[int]], total: int) -> int:
    """The smallest N whose allocation gives every stratum at least one draw."""
    sizes = {s: len(m) for s, m in groups.items()}
    return next(n for n in range(len(sizes), total + 1) if min(allocate(n, sizes).values()) > 0)


def draw_fewshot(
    task: Task, examples: list[Example], train: list[Example], data: DataConfig
) -> tuple[list[Example], dict]:
    """``(drawn, record)``: ``data.fewshot_examples`` of ``train`` (what is left of
    ``examples``, the whole training file, once the validation split is held out; the same
    objects) drawn by ``data.fewshot_seed``, in file order, and meta.json's ``fewshot`` record."""
    n = data.fewshot_examples
    assert n is not None
    if data.max_train_samples is not None:
        raise UserError(
            "data.max_train_samples and data.fewshot_examples are both set: keep one "
            "(fewshot_examples draws the training set; set max_train_samples to null)"
        )
    row = {id(e): i for i, e in enumerate(examples)}  # carve_validation keeps the objects
    positions = stratified_ids(task, train, n, data.fewshot_seed)
    drawn = [train[i] for i in positions]
    counts = strata(task, train)
    record = {
        "examples": n,
        "seed": data.fewshot_seed,
        "drawn_from": len(train),
        "per_stratum": {
            (task.labels[s] if not task.is_regression else f"quintile {s}"): sum(
                counts[i] == s for i in positions
            )
            for s in sorted(set(counts))
        },
        "ids": [row[id(e)] for e in drawn],
    }
    return drawn, record
