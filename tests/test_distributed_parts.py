"""The pieces of multi-process training, one at a time: sharding a global batch, the per-shard
loss weight and the tail rule.

The end-to-end comparison (P processes against one process at the same global batch) is in
``test_distributed.py``.
"""

from __future__ import annotations

import pytest
import torch

from aclpipe.training.distributed import local_weight, shard
from aclpipe.training.loop import global_batches


@pytest.mark.parametrize("size", range(1, 9))
def test_shards_are_balanced_contiguous_and_in_order(size: int) -> None:
    for n in range(size, 3 * size + 1):
        batch = list(range(100, 100 + n))
        parts = [shard(batch, rank, size) for rank in range(size)]
        assert [i for part in parts for i in part] == batch  # process order = batch order
        lengths = [len(part) for part in parts]
        assert min(lengths) >= 1, (n, lengths)  # no rank trains on an empty shard
        assert max(lengths) - min(lengths) <= 1, (n, lengths)


def test_shards_of_two_processes_are_unchanged() -> None:
    """P = 2 splits as before (the first half to rank 0), so existing runs keep their batches."""
    for n in range(2, 20):
        per = -(-n // 2)
        assert shard(list(range(n)), 0, 2) == list(range(per))
        assert shard(list(range(n)), 1, 2) == list(range(per, n))


def test_shard_of_one_process_is_the_batch() -> None:
    assert shard([3, 1, 2], 0, 1) == [3, 1, 2]


@pytest.mark.parametrize("size", range(1, 9))
def test_local_weights_make_the_global_mean(size: int) -> None:
    """Weighted shard means, averaged over processes as DDP does, give the global mean."""
    values = torch.arange(3 * size, dtype=torch.float64) ** 1.5
    for n in range(size, 3 * size + 1):
        batch = list(range(n))
        shards = [shard(batch, rank, size) for rank in range(size)]
        weighted = [local_weight(len(s), n, size) * values[s].mean() for s in shards]
        assert float(sum(weighted) / size) == pytest.approx(float(values[:n].mean()), rel=1e-12)


@pytest.mark.parametrize("size", (1, 2, 3, 4))
def test_a_tail_with_fewer_rows_than_processes_is_dropped(size: int) -> None:
    per_process = 3
    for tail in range(0, per_process * size):
        n = 2 * per_process * size + tail
        assert global_batches(n, per_process, size) == 2 + (tail >= size)
