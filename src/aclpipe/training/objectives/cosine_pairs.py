"""SetFit's cosine-similarity objective over every pair of the batch (Tunstall et al. 2022)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def cosine_pairs_loss(features: Tensor, labels: Tensor) -> Tensor:
    """Mean squared error between each pair's cosine similarity and whether it shares a label.

    SetFit's CosineSimilarityLoss scores sampled sentence pairs: target 1 for two sentences of
    one class, 0 for two of different classes, loss ``(cos(u_i, u_j) - target)^2``. Here the
    pairs are every unordered pair ``i < j`` of the batch, so a batch of B sentences gives
    B (B - 1) / 2 pairs from B encodings, where SetFit's batch of B pairs costs 2B.

    Args:
        features: raw pooled features ``z_i``, ``[B, D]``; normalised here.
        labels: integer labels, ``[B]``.

    Returns:
        Scalar loss; exactly 0 (zero gradient) for a batch of one (no pair).

    Reference:
        Tunstall et al. 2022, Efficient Few-Shot Learning Without Prompts (SetFit), section 3.1;
        docs/methods.md, "cosine-pairs".
    """
    n = features.shape[0]
    if n < 2:
        return features.sum() * 0.0
    unit_features = F.normalize(features, dim=-1)  # [B, D]
    cosine = unit_features @ unit_features.T  # [B, B]
    same = (labels[:, None] == labels[None, :]).to(cosine.dtype)  # [B, B], 1 for a shared label
    i, j = torch.triu_indices(n, n, offset=1, device=features.device)  # [2, B (B - 1) / 2]
    return F.mse_loss(cosine[i, j], same[i, j])
