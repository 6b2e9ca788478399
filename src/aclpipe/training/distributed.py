"""What training needs from torch.distributed, and nothing when there is one process.

Under ``torchrun`` / ``accelerate launch`` each process takes its own shard of every global
batch. Per-sample-mean losses (CE, distillation) are weighted by ``local_weight`` so that the
average DDP takes over processes equals the mean over the global batch. Contrastive losses use
the global batch as their pool: features are gathered from every process with gradients
flowing back to each process's own (``gather_with_grad``), and every process computes the same
global loss; the gradient sum in ``gather_with_grad``'s backward and DDP's average then give
exactly the gradient of one process at the global batch (docs/methods.md, the contrastive core).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard(global_batch: list[int], rank: int, size: int) -> list[int]:
    """This process's contiguous slice of a global batch of indices.

    Slices are balanced (their lengths differ by at most one, the longer ones first) and in
    process order, so every process has a sample whenever ``len(global_batch) >= size`` and the
    concatenation over processes is the global batch (the order the contrastive pool is
    gathered in). A tail of 4 over 3 processes splits [2, 1, 1], not [2, 2, 0]."""
    per, longer = divmod(len(global_batch), size)
    start = rank * per + min(rank, longer)
    return global_batch[start : start + per + (rank < longer)]


def local_weight(local: int, global_: int, size: int) -> float:
    """Weight of a per-sample mean over ``local`` samples so that the mean over processes of
    the weighted losses is the mean over all ``global_`` samples."""
    return local * size / global_


class _GatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        rank, size = world()
        longest = max(sizes)
        padded = x.new_zeros((longest, *x.shape[1:]))
        padded[: x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(parts, padded.contiguous())
        ctx.rank, ctx.sizes, ctx.longest = rank, sizes, longest
        return torch.cat([p[:n] for p, n in zip(parts, sizes)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)  # every process's loss reaches every process's features
        start = sum(ctx.sizes[: ctx.rank])
        return grad[start : start + ctx.sizes[ctx.rank]], None


def gather_with_grad(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Concatenate ``x`` from every process along ``dim`` (shapes may differ along ``dim``);
    gradients flow back to each process's own part. Identity with one process."""
    _, size = world()
    if size == 1:
        return x
    moved = x.movedim(dim, 0)
    sizes = [0] * size
    dist.all_gather_object(sizes, moved.shape[0])
    return _GatherWithGrad.apply(moved, sizes).movedim(0, dim)


def gather_labels(labels: torch.Tensor) -> torch.Tensor:
    """Labels from every process, in process order (no gradient)."""
    return gather_with_grad(labels.float()).to(labels.dtype) if world()[1] > 1 else labels


def all_reduce_mean(grads: list[torch.Tensor | None], params: list[torch.Tensor]) -> list:
    """Average per-parameter gradients over processes (None counts as zeros).

    A gradient that is None on every process stays None, as with one process (and as DDP's
    reducer leaves a globally unused parameter): the optimizer then skips that parameter
    rather than moving it by momentum and weight decay on a zero gradient. Which parameters
    some process reached is settled by one small all-reduce of a flag per parameter."""
    _, size = world()
    if size == 1:
        return list(grads)
    device = params[0].device if params else None  # NCCL reduces device tensors only
    reached = torch.tensor([g is not None for g in grads], dtype=torch.int32, device=device)
    dist.all_reduce(reached)
    out: list[torch.Tensor | None] = []
    for g, p, anywhere in zip(grads, params, reached.tolist(), strict=True):
        if not anywhere:
            out.append(None)
            continue
        g = torch.zeros_like(p) if g is None else g.contiguous().clone()
        dist.all_reduce(g)
        out.append(g / size)
    return out


def mean_over_processes(values: dict, keys: tuple[str, ...]) -> dict:
    """The mean over processes of the scalars ``values[k]`` for the keys present.

    Each process's loss is its shard's weighted mean (``local_weight``), so the mean over
    processes is the global batch's loss."""
    present = [k for k in keys if k in values]
    if world()[1] == 1 or not present:
        return {k: values[k] for k in present}
    tensor = torch.tensor(
        [float(values[k]) for k in present], dtype=torch.float64, device=_collective_device()
    )
    dist.all_reduce(tensor)
    tensor /= world()[1]
    return dict(zip(present, tensor.tolist()))


def _collective_device() -> torch.device:
    """Where a tensor made for a collective must live: NCCL reduces CUDA tensors only."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
