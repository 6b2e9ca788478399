"""Cross-layer ACL (XACL_k): a student exit contrasted with the deepest exit as teacher."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aclpipe.training.objectives.supcon import supcon


def cross_layer_acl_loss(
    student: Tensor,
    teacher: Tensor,
    labels: Tensor,
    teacher_label_embeddings: Tensor,
    tau: float,
) -> Tensor:
    """SupCon of student features against the detached teacher features and label embeddings.

    Anchors are the student features ``u_i^k``; the pool is
    ``{sg(u_j^L)} ∪ {sg(e_c^L)}``. The positives of ``u_i^k`` are the teacher features of
    same-label samples (its own, ``sg(u_i^L)``, included) and ``sg(e_{y_i}^L)``; the
    denominator runs over the whole pool (an anchor is not a pool member). The gradient
    flows into the student only.

    Args:
        student: raw pooled features of student exit ``k < L``, ``[B, D]``.
        teacher: raw pooled features of the deepest exit ``L``, ``[B, D]``; detached here.
        labels: integer labels in ``[0, C)``, ``[B]``.
        teacher_label_embeddings: raw label embeddings of exit ``L``, ``[C, D]``; detached.
        tau: temperature (docs/methods.md default 0.1).

    Returns:
        Scalar loss ``XACL_k``; finite for any batch, since every anchor has positives.

    Reference:
        docs/methods.md, "Cross-layer ACL"; SupCon of Khosla et al. 2020, eq. 2.
    """
    num_classes = teacher_label_embeddings.shape[0]
    anchors = F.normalize(student, dim=-1)  # [B, D]
    pool = torch.cat(
        [F.normalize(teacher, dim=-1), F.normalize(teacher_label_embeddings, dim=-1)]
    ).detach()  # [B + C, D]
    class_ids = torch.arange(num_classes, device=labels.device, dtype=labels.dtype)  # [C]
    pool_labels = torch.cat([labels, class_ids])  # [B + C]
    return supcon(anchors, labels, pool, pool_labels, tau, anchor_in_pool=None)
