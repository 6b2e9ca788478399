"""The order the training rows are taken in, one epoch at a time.

A pure function of (seed, stage, epoch) and the rows' lengths, so that a resumed run takes the
same batches as an uninterrupted one, and every process computes the same global order and
takes its own slice of each global batch (``aclpipe.training.distributed.shard``).

With ``group_by_length`` the rows of a batch have similar lengths, so ``collate`` pads far
less: SST-2 averages 12 tokens a sentence, but a random batch of 32 pads to ~38. The grouping
follows the Hugging Face Trainer's ``LengthGroupedSampler``
(``transformers.trainer_pt_utils.get_length_grouped_indices``): shuffle, cut into mega-batches
of up to 50 global batches, sort each mega-batch by length, cut it into batches. Two choices
differ from it, on purpose:

- The batches are then shuffled. The Trainer keeps each mega-batch's batches in order, longest
  to shortest, so the length (and with it the loss scale of per-token terms and the step
  time) runs down a saw-tooth across the epoch; shuffled batches keep the grouping's savings
  without a schedule in the lengths.
- The batch holding the longest row comes first, as the Trainer does, so that a batch that
  does not fit in memory fails at the first step, not hours in. The Trainer swaps one row to
  the front; we move the whole batch, which stays homogeneous.

A short last batch (fewer rows than a global batch) stays last, where ``global_batches``
expects it.
"""

from __future__ import annotations

import torch

MEGA_BATCHES = 50  # global batches per mega-batch, at most (the Trainer's mega_batch_mult)


def epoch_order(
    lengths: list[int], global_size: int, seed: int, stage: int, epoch: int, grouped: bool
) -> list[int]:
    """Row indices in the order one epoch takes them; batch ``i`` is the slice
    ``[i * global_size, (i + 1) * global_size)``. ``lengths[i]``: tokens in row ``i``.
    ``grouped``: batches of similar lengths (above) instead of a plain shuffle."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + stage * 1_009 + epoch)
    shuffled = torch.randperm(len(lengths), generator=generator).tolist()
    if not grouped:
        return shuffled
    return _length_grouped(shuffled, lengths, global_size, generator)


def mega_batch_size(n: int, global_size: int) -> int:
    """Rows per mega-batch: ``MEGA_BATCHES`` global batches, or fewer so that a small data
    set still has ~4 mega-batches (the Trainer's rule), and at least one global batch."""
    return max(1, min(MEGA_BATCHES, n // (4 * global_size))) * global_size


def _length_grouped(
    shuffled: list[int], lengths: list[int], global_size: int, generator: torch.Generator
) -> list[int]:
    mega = mega_batch_size(len(shuffled), global_size)  # a multiple of global_size
    batches: list[list[int]] = []
    for start in range(0, len(shuffled), mega):
        # stable sort: rows of equal length keep their shuffled order
        group = sorted(shuffled[start : start + mega], key=lambda i: -lengths[i])
        batches += [group[j : j + global_size] for j in range(0, len(group), global_size)]
    tail = batches.pop() if len(batches[-1]) < global_size else []  # only the last can be short
    if not batches:  # fewer rows than one global batch
        return tail
    batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    longest = max(range(len(batches)), key=lambda b: lengths[batches[b][0]])  # first = longest
    batches[0], batches[longest] = batches[longest], batches[0]
    return [i for batch in batches for i in batch] + tail
