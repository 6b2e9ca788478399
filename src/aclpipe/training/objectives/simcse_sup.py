"""Supervised SimCSE: labelled positive pairs, in-batch negatives, hard negatives where given."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aclpipe.errors import UserError


def simcse_sup_loss(features: Tensor, sizes: Tensor, tau: float) -> Tensor:
    """InfoNCE over (anchor, positive[, hard negative]) rows, the batch's others as negatives.

    Row ``i`` holds an anchor ``h_i``, its positive ``h_i^+`` and, where the data gives one, a
    hard negative ``h_i^-``. With ``s`` the cosine similarity and ``N`` the rows that have a
    hard negative::

        l_i = -log( exp(s(h_i, h_i^+) / tau)
                    / (sum_j exp(s(h_i, h_j^+) / tau) + sum_{j in N} exp(s(h_i, h_j^-) / tau)) )

    and the loss is the mean of ``l_i`` over the rows (SimCSE's supervised loss, eq. 5, with
    the hard-negative sum over the rows that have one). As in SimCSE, a sentence that occurs
    in two rows of one batch is a negative of the other row's anchor.

    Args:
        features: pooled embeddings, ``[S, D]``, row by row: each row's anchor, positive and
            (if any) hard negative, consecutively; not normalised.
        sizes: ``[B]`` long, each row's number of sentences (2 or 3); ``sizes.sum() == S``.
        tau: temperature (docs/sentence_embeddings.md: 0.05).

    Returns:
        Scalar loss, float32 or wider.

    Raises:
        UserError: a batch of one row (no in-batch negative).

    Reference:
        Gao, Yao and Chen 2021, SimCSE, eq. 5; docs/sentence_embeddings.md.
    """
    sizes = sizes.to(torch.long)
    if int(sizes.sum()) != features.shape[0] or bool(((sizes < 2) | (sizes > 3)).any()):
        raise ValueError(f"rows of 2 or 3 sentences summing to {features.shape[0]}, got {sizes}")
    if sizes.shape[0] < 2:
        raise UserError(
            "simcse-sup needs at least 2 pairs per batch (the other pairs are the negatives): "
            "set train.batch_size to 2 or more"
        )
    starts = torch.cumsum(sizes, 0) - sizes  # [B], each row's first sentence
    unit = F.normalize(features, dim=-1)  # [S, D]
    anchors, positives = unit[starts], unit[starts + 1]  # [B, D] each
    negatives = unit[(starts + 2)[sizes == 3]]  # [N, D]
    logits = anchors @ torch.cat([positives, negatives]).T  # [B, B + N]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / tau
    targets = torch.arange(sizes.shape[0], device=features.device)  # [B]
    return F.cross_entropy(logits, targets)
