"""SCL: supervised contrastive loss over the batch (Gunel et al. 2020)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aclpipe.training.objectives.supcon import supcon


def scl_loss(features: Tensor, labels: Tensor, tau: float) -> Tensor:
    """Supervised contrastive loss with anchors = pool = the batch's normalised features.

    Each sample is contrasted with every other sample of the batch; its positives are the
    other samples of its class. Only the contrastive term: the ``(1 - lam) * CE + lam * SCL``
    mix is the caller's.

    Args:
        features: raw pooled features ``z_i``, ``[B, D]``; normalised here.
        labels: integer labels, ``[B]``.
        tau: temperature (docs/methods.md default 0.3).

    Returns:
        Scalar loss; exactly 0 (zero gradient) when no sample has a same-class partner,
        e.g. a batch of one.

    Reference:
        Gunel et al. 2020, Supervised Contrastive Learning for Pre-trained Language Model
        Fine-tuning, eq. 2; docs/methods.md, "Single-exit objectives".
    """
    normalised = F.normalize(features, dim=-1)  # [B, D]
    own_index = torch.arange(features.shape[0], device=features.device)  # [B]
    return supcon(normalised, labels, normalised, labels, tau, anchor_in_pool=own_index)
