"""The contrastive core of every ACL-family objective: supervised contrastive loss over a pool."""

from __future__ import annotations

import torch
from torch import Tensor


def supcon(
    anchors: Tensor,
    anchor_labels: Tensor,
    pool: Tensor,
    pool_labels: Tensor,
    tau: float,
    anchor_in_pool: Tensor | None = None,
) -> Tensor:
    """Supervised contrastive loss of a set of anchors against a pool.

    For each anchor ``a`` with positives ``P(a)`` (pool members with the anchor's label,
    never the anchor itself)::

        l(a) = -1/|P(a)| * sum_{p in P(a)} log( exp(a.p / tau) / Z(a) ),
        Z(a) = sum_{q in pool, q != a} exp(a.q / tau)

    The loss is the mean of ``l(a)`` over the anchors with ``|P(a)| > 0``; anchors without a
    positive are left out. When no anchor has a positive the loss is exactly 0, with a zero
    gradient that is still connected to ``anchors`` and ``pool`` (so backward and
    ``torch.autograd.grad`` work as usual).

    Args:
        anchors: L2-normalised anchor vectors, ``[A, D]``.
        anchor_labels: integer labels of the anchors, ``[A]``.
        pool: L2-normalised pool vectors, ``[P, D]``.
        pool_labels: integer labels of the pool members, ``[P]``.
        tau: temperature, > 0.
        anchor_in_pool: ``[A]`` long, the index of each anchor in the pool, or -1 for an
            anchor that is not a pool member; that pool member is excluded from the
            anchor's positives and from its denominator. ``None``: no anchor is a member.

    Returns:
        Scalar loss, in float32 or the inputs' dtype if wider.

    Reference:
        Khosla et al. 2020, Supervised Contrastive Learning, eq. 2 (``L^sup_out``);
        docs/methods.md, "The contrastive core".
    """
    num_anchors, num_pool = anchors.shape[0], pool.shape[0]
    pool_index = torch.arange(num_pool, device=pool.device)
    if anchor_in_pool is None:
        is_self = torch.zeros(num_anchors, num_pool, dtype=torch.bool, device=pool.device)
    else:
        is_self = anchor_in_pool.to(pool.device)[:, None] == pool_index[None, :]  # [A, P]
    is_positive = (anchor_labels[:, None] == pool_labels[None, :]) & ~is_self  # [A, P]
    has_positive = is_positive.any(dim=1)  # [A]
    if not bool(has_positive.any()):
        return (anchors.sum() + pool.sum()) * 0.0

    # Only anchors with a positive take part: a row without one would be 0/0 (NaN).
    anchors, is_self, is_positive = (
        anchors[has_positive],
        is_self[has_positive],
        is_positive[has_positive],
    )
    logits = anchors @ pool.T  # [A', P]
    # Half-precision similarities (autocast) are widened: exp(1 / tau) needs the range.
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / tau
    denominator_logits = logits.masked_fill(is_self, float("-inf"))  # [A', P]
    # Each remaining row has at least one positive, hence one finite entry: the max is finite.
    row_max = denominator_logits.max(dim=1, keepdim=True).values.detach()  # [A', 1]
    log_denominator = (denominator_logits - row_max).exp().sum(dim=1, keepdim=True).log()  # [A', 1]
    log_prob = logits - row_max - log_denominator  # [A', P]
    positive_log_prob = torch.where(is_positive, log_prob, torch.zeros_like(log_prob))
    per_anchor = -positive_log_prob.sum(dim=1) / is_positive.sum(dim=1)  # [A']
    return per_anchor.mean()
