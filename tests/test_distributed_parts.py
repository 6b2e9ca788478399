"""The pieces of multi-process training, one at a time: sharding a global batch, the per-shard
loss weight, the tail rule, and the gradient all-reduce (in forked gloo process groups).

The end-to-end comparison (P processes against one process at the same global batch) is in
``test_distributed.py``.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from aclpipe.training.distributed import (
    all_reduce_mean,
    local_weight,
    mean_over_processes,
    shard,
)
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
        # an objective that needs 2 rows (in-batch negatives) also drops a 1-row tail
        assert global_batches(n, per_process, size, 2) == 2 + (tail >= max(size, 2))


def in_processes(size: int, body: Callable[[int], object]) -> list:
    """``body(rank)`` in ``size`` forked processes joined in a gloo group; their results.

    Forked from pytest (torch is imported already), a group starts in well under a second."""
    folder = Path(tempfile.mkdtemp())
    store = folder / "store"
    sys.stdout.flush()
    sys.stderr.flush()
    pids = []
    for rank in range(size):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns into pytest
            code = 0
            try:
                dist.init_process_group(
                    "gloo", init_method=f"file://{store}", rank=rank, world_size=size
                )
                result = body(rank)
                dist.destroy_process_group()
            except BaseException:  # a child must never unwind into pytest's own frames
                result, code = traceback.format_exc(), 3
            (folder / f"{rank}.pkl").write_bytes(pickle.dumps(result))
            os._exit(code)
        pids.append(pid)
    codes = [os.waitpid(pid, 0)[1] for pid in pids]
    results = [pickle.loads((folder / f"{rank}.pkl").read_bytes()) for rank in range(size)]
    assert codes == [0] * size, results
    return results


def _reduce_with_unreached(rank: int) -> list:
    params = [torch.zeros(2), torch.zeros(3), torch.zeros(1)]
    grads = [
        None,  # reached by no process
        torch.full((3,), 2.0) if rank == 0 else None,  # reached by process 0 only
        torch.full((1,), float(rank + 1)),  # reached by both
    ]
    reduced = all_reduce_mean(grads, params)
    return [None if g is None else g.tolist() for g in reduced]


def test_a_gradient_no_process_computed_stays_none() -> None:
    """A parameter that no process reached keeps ``grad = None`` (AdamW then skips it, as one
    process would) instead of a zero gradient that moves it by momentum and weight decay."""
    results = in_processes(2, _reduce_with_unreached)
    assert results[0] == results[1] == [None, [1.0, 1.0, 1.0], [1.5]]


class _PartlyUsed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(2, 1)
        self.never = nn.Parameter(torch.ones(3))
        self.rank0_only = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        y = self.used(x).sum()
        return y + 2 * self.rank0_only.sum() if rank == 0 else y


def _ddp_backward(rank: int) -> dict:
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(_PartlyUsed(), find_unused_parameters=True)
    grads = {}
    for step in range(2):
        model(torch.ones(1, 2), rank).backward()
        grads[step] = {
            n: None if p.grad is None else p.grad.tolist()
            for n, p in model.module.named_parameters()
        }
        model.zero_grad(set_to_none=True)
    return grads


def test_ddp_leaves_a_globally_unused_gradient_none() -> None:
    """The plain-sum path's backward goes through DDP's reducer (``find_unused_parameters``):
    a parameter no process used keeps ``grad = None``; one used by some processes gets the
    average with zeros for the others. The loop relies on this (torch >= 2.x behaviour)."""
    for grads in in_processes(2, _ddp_backward):
        for step in (0, 1):
            assert grads[step]["never"] is None
            assert grads[step]["rank0_only"] == [1.0, 1.0]  # (2 + 0) / 2
            assert grads[step]["used.bias"] == [1.0]


def test_logged_losses_are_averaged_over_processes() -> None:
    def body(rank: int) -> dict:
        logged = {"loss": 1.0 + rank, "main": 2.0 * rank, "step": 7}
        return mean_over_processes(logged, ("loss", "main", "aux"))

    assert in_processes(2, body) == [{"loss": 1.5, "main": 1.0}] * 2
