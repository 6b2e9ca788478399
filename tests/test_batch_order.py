"""The epoch's order of training rows: a plain shuffle, or batches grouped by length.

Unit tests on lengths drawn from a skewed distribution like SST-2's (most sentences short, a
long tail), and one end-to-end test that a run with grouping on, interrupted mid-epoch and
resumed, lands on the same weights as an uninterrupted run.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from paths import at
from rich.console import Console
from safetensors.torch import load_file

import aclpipe.training.loop as loop
from aclpipe.config import load_params
from aclpipe.data.tasks import get_task
from aclpipe.layout import PARAMS, WEIGHTS
from aclpipe.modeling.batching import collate
from aclpipe.stages.finetune import finetune
from aclpipe.training.batch_order import MEGA_BATCHES, epoch_order, mega_batch_size
from aclpipe.training.distributed import shard


def skewed_lengths(n: int, seed: int = 0) -> list[int]:
    """Token counts like SST-2's: lognormal around 12, a tail to 64 (the truncation)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(12), 0.6, n).round(), 3, 64).astype(int).tolist()


def batches(order: list[int], size: int) -> list[list[int]]:
    return [order[i : i + size] for i in range(0, len(order), size)]


def padded_tokens(order: list[int], lengths: list[int], size: int) -> int:
    """Tokens ``collate`` makes of the epoch: each batch padded to its longest row."""
    return sum(len(b) * max(lengths[i] for i in b) for b in batches(order, size))


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize(("n", "size"), [(2000, 32), (1000, 64), (97, 8), (5, 8), (1, 1)])
def test_order_is_a_permutation(n: int, size: int, grouped: bool) -> None:
    order = epoch_order(skewed_lengths(n), size, seed=42, stage=0, epoch=0, grouped=grouped)
    assert sorted(order) == list(range(n))


@pytest.mark.parametrize("grouped", [False, True])
def test_order_is_a_pure_function_of_seed_stage_and_epoch(grouped: bool) -> None:
    lengths = skewed_lengths(640)

    def order(seed: int, stage: int, epoch: int) -> list[int]:
        return epoch_order(lengths, 32, seed, stage, epoch, grouped)

    assert order(42, 0, 1) == order(42, 0, 1)
    others = [order(43, 0, 1), order(42, 1, 1), order(42, 0, 2)]
    assert all(other != order(42, 0, 1) for other in others)


def test_plain_shuffle_is_unchanged() -> None:
    """Without grouping the order is the one runs took before grouping existed, so a run with
    ``group_by_length: false`` reproduces them."""
    generator = torch.Generator().manual_seed(7 * 1_000_003 + 1 * 1_009 + 2)
    want = torch.randperm(100, generator=generator).tolist()
    assert epoch_order(skewed_lengths(100), 16, seed=7, stage=1, epoch=2, grouped=False) == want


def test_grouped_batches_pad_far_less_than_random_ones() -> None:
    """On SST-2-like lengths (mean ~13 tokens) a random batch of 32 pads to ~40 tokens a row;
    grouped batches pad to within a few tokens of the mean."""
    lengths, size = skewed_lengths(2048), 32
    plain = padded_tokens(epoch_order(lengths, size, 42, 0, 0, grouped=False), lengths, size)
    grouped = padded_tokens(epoch_order(lengths, size, 42, 0, 0, grouped=True), lengths, size)
    real = sum(lengths)
    assert plain > 2.5 * real  # the random order's padding, for scale
    assert grouped < 0.5 * plain
    assert grouped < 1.3 * real
    spreads = [
        max(lengths[i] for i in batch) - min(lengths[i] for i in batch)
        for batch in batches(epoch_order(lengths, size, 42, 0, 0, grouped=True), size)
    ]
    assert sorted(spreads)[len(spreads) // 2] <= 1  # the median batch: one or two lengths


def test_longest_batch_comes_first() -> None:
    """The batch holding the longest row is the first step's, as in the HF Trainer: a batch that
    does not fit in memory fails at once, not hours into the epoch."""
    for seed in range(5):
        lengths = skewed_lengths(1000, seed)
        order = epoch_order(lengths, 32, seed, 0, 0, grouped=True)
        first = order[:32]
        assert max(lengths[i] for i in first) == max(lengths)
        assert sorted((lengths[i] for i in first), reverse=True) == [lengths[i] for i in first]


def test_batch_order_is_shuffled_not_long_to_short() -> None:
    """Unlike the Trainer, which keeps each mega-batch's batches longest to shortest, the
    batches come in a shuffled order: no saw-tooth of lengths across the epoch."""
    lengths, size = skewed_lengths(3200), 32
    order = epoch_order(lengths, size, 42, 0, 0, grouped=True)
    widths = [max(lengths[i] for i in b) for b in batches(order, size)]
    mega = mega_batch_size(len(lengths), size) // size
    assert mega == MEGA_BATCHES // 2  # 3200 rows: 25 batches a mega-batch (4 mega-batches)
    falls = sum(a >= b for a, b in zip(widths[1:], widths[2:]))
    assert falls < 0.8 * (len(widths) - 2)  # sorted within mega-batches would be ~all
    assert widths[1:] != sorted(widths[1:], reverse=True)


def test_a_short_last_batch_stays_last() -> None:
    """1000 rows in batches of 32: 31 full batches, then 8 rows, where ``global_batches``
    expects the short one."""
    lengths, size = skewed_lengths(1000), 32
    order = epoch_order(lengths, size, 42, 0, 0, grouped=True)
    full, tail = order[: 31 * size], order[31 * size :]
    assert len(tail) == 8
    mega = mega_batch_size(len(lengths), size)  # the tail is the last mega-batch's shortest
    plain = epoch_order(lengths, size, 42, 0, 0, grouped=False)
    last_mega = set(plain[(len(plain) - 1) // mega * mega :])
    assert set(tail) <= last_mega
    assert max(lengths[i] for i in tail) <= min(lengths[i] for i in full if i in last_mega)


def test_shards_of_a_grouped_global_batch_have_similar_lengths() -> None:
    """Two processes at 16 each split a global batch of 32 that was grouped as a whole: each
    shard pads to about what the other does."""
    lengths, size, processes = skewed_lengths(2048), 16, 2

    def gaps(grouped: bool) -> list[int]:
        order = epoch_order(lengths, size * processes, 42, 0, 0, grouped)
        widths = [
            [max(lengths[i] for i in shard(batch, r, processes)) for r in range(processes)]
            for batch in batches(order, size * processes)
        ]
        return [w[0] - w[1] for w in widths]

    grouped, plain = gaps(True), gaps(False)
    assert min(grouped) >= 0  # sorted longest first: process 0 takes the front
    assert np.median(grouped) <= 1  # the typical global batch: both shards pad alike
    assert np.mean(grouped) < np.mean(np.abs(plain)) / 3  # the long tail's batches aside


# End to end: resume mid-epoch with grouping on ------------------------------------------

TRAIN = {"epochs": 2, "batch_size": 4, "group_by_length": True}  # 48 rows: 12 steps an epoch


def _finetune(work: Path, widths: list[int] | None = None, **overrides: str) -> Path:
    """``finetune`` joint on the project in ``work``; each batch's padded width into ``widths``."""

    def recording(rows: list[dict], pad_id: int, regression: bool) -> dict:
        batch = collate(rows, pad_id, regression)
        if widths is not None:
            widths.append(batch["input_ids"].shape[1])
        return batch

    sets = [f"{k}={v}" for k, v in overrides.items()]
    params = load_params(work / PARAMS, sets)
    out = at(work).model("sst2", "joint")
    quiet = Console(file=io.StringIO())
    finetune(
        get_task("sst2"), "joint", params, at(work).data("sst2"), out, quiet, collate=recording
    )
    return out


@pytest.mark.slow
def test_resume_mid_epoch_with_grouping_gives_the_same_weights(
    make_project, tmp_path: Path, monkeypatch
) -> None:
    reference_widths: list[int] = []
    reference = _finetune(make_project(tmp_path / "reference", train=TRAIN), reference_widths)
    plain_widths: list[int] = []
    _finetune(
        make_project(tmp_path / "plain", train={**TRAIN, "group_by_length": False}), plain_widths
    )
    assert sum(reference_widths) < sum(plain_widths)  # grouping was in force

    work = make_project(tmp_path / "interrupted", train=TRAIN)
    real_step = loop._optimizer_step

    def interrupted(optimizer, global_step: int) -> None:
        if global_step == 17:  # stage 1, epoch 2, batch 6 of 12: mid-epoch
            raise KeyboardInterrupt
        real_step(optimizer, global_step)

    monkeypatch.setattr(loop, "_optimizer_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _finetune(work, **{"train.save_every": "1"})
    monkeypatch.setattr(loop, "_optimizer_step", real_step)
    resumed_widths: list[int] = []
    resumed = _finetune(work, resumed_widths, **{"train.save_every": "1"})

    assert resumed_widths == reference_widths[17:]  # the same batches from the checkpoint on
    got, want = load_file(resumed / WEIGHTS), load_file(reference / WEIGHTS)
    assert got.keys() == want.keys()
    assert [k for k in want if not torch.equal(got[k], want[k])] == []
