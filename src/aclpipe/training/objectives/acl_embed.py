"""ACL-Embed: label embeddings as extra contrastive samples, one per class."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aclpipe.training.objectives.supcon import supcon


def acl_embed_loss(
    features: Tensor, labels: Tensor, label_embeddings: Tensor, tau: float
) -> Tensor:
    """SupCon over the pool ``{u_i} ∪ {e_c}``, with the whole pool as anchors.

    Label embedding ``c`` carries label ``c``, so every sample has at least its own class's
    embedding as a positive, and each embedding is pulled toward the batch's samples of its
    class and pushed from the others. An embedding whose class is absent from the batch has
    no positive and is left out of the mean.

    Args:
        features: raw pooled features ``z_i``, ``[B, D]``; normalised here.
        labels: integer labels in ``[0, C)``, ``[B]``.
        label_embeddings: raw label embeddings (classifier rows ``W[c]`` or a separate
            table), ``[C, D]``; normalised here.
        tau: temperature (docs/methods.md default 0.1).

    Returns:
        Scalar loss ``L_acl``; finite for a batch of one.

    Reference:
        docs/methods.md, "ACL-Embed"; label rows as augmented samples as in DualCL
        (Chen et al. 2022); SupCon of Khosla et al. 2020, eq. 2.
    """
    num_classes = label_embeddings.shape[0]
    pool = torch.cat(
        [F.normalize(features, dim=-1), F.normalize(label_embeddings, dim=-1)]
    )  # [B + C, D]
    class_ids = torch.arange(num_classes, device=labels.device, dtype=labels.dtype)  # [C]
    pool_labels = torch.cat([labels, class_ids])  # [B + C]
    own_index = torch.arange(pool.shape[0], device=pool.device)  # [B + C]
    return supcon(pool, pool_labels, pool, pool_labels, tau, anchor_in_pool=own_index)
