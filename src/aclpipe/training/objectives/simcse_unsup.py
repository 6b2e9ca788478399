"""Unsupervised SimCSE: a sentence and its own second encoding under dropout are a positive."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aclpipe.errors import UserError


def simcse_unsup_loss(features: Tensor, tau: float) -> Tensor:
    """InfoNCE over a batch in which every sentence was encoded twice under dropout.

    Row ``i`` of the batch is encoded twice (two dropout masks), giving ``h_i`` and ``h_i^+``;
    with ``s`` the cosine similarity::

        l_i = -log( exp(s(h_i, h_i^+) / tau) / sum_j exp(s(h_i, h_j^+) / tau) )

    and the loss is the mean of ``l_i`` over the batch: the second encodings of the other
    sentences are the negatives (SimCSE's own code: one direction, ``CE(sim(z1, z2) / tau,
    arange(B))``). Two copies of the same sentence in one batch are two rows: each is the
    other's negative, as in SimCSE (the prepared sentences are deduplicated, so it does not
    happen in training).

    Args:
        features: pooled embeddings, ``[2B, D]``, row-major: ``features[2i]`` is ``h_i``,
            ``features[2i + 1]`` its second encoding ``h_i^+`` (the loop encodes each row
            ``Stage.views = 2`` times, consecutively); not normalised (cosine is taken here).
        tau: temperature (docs/sentence_embeddings.md: 0.05).

    Returns:
        Scalar loss, float32 or wider.

    Raises:
        UserError: a batch of one sentence (no negative: the loss is 0 whatever the model).

    Reference:
        Gao, Yao and Chen 2021, SimCSE: Simple Contrastive Learning of Sentence Embeddings,
        eq. 1 and section 3; docs/sentence_embeddings.md.
    """
    if features.shape[0] % 2:
        raise ValueError(f"simcse-unsup takes two encodings per sentence, got {features.shape[0]}")
    views = features.reshape(features.shape[0] // 2, 2, features.shape[-1])  # [B, 2, D]
    if views.shape[0] < 2:
        raise UserError(
            "simcse-unsup needs at least 2 sentences per batch (the other sentences are the "
            "negatives): set train.batch_size to 2 or more"
        )
    first = F.normalize(views[:, 0], dim=-1)  # [B, D]
    second = F.normalize(views[:, 1], dim=-1)  # [B, D]
    logits = first @ second.T  # [B, B], cosine similarities
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / tau
    targets = torch.arange(views.shape[0], device=features.device)  # [B]
    return F.cross_entropy(logits, targets)
