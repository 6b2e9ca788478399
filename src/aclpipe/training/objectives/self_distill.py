"""Self-distillation of an exit from the deepest exit (RomeBERT, FastBERT-style)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _widened(logits: Tensor) -> Tensor:
    """Half-precision logits (autocast) in float32; float32 and float64 as they are."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def distill_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    T: float,
    *,
    regression: bool = False,
    reduction: str = "batchmean",
) -> Tensor:
    """Distillation term ``T^2 * KL(sg(p_teacher^T) || p_student^T)``, averaged over the batch.

    Args:
        student_logits: logits of the student exit, ``[B, C]``.
        teacher_logits: logits of the teacher (deepest) exit, ``[B, C]``; detached here.
        T: distillation temperature (docs/methods.md default 3).
        regression: STS-B (``C = 1``). A KL between one-output "distributions" has no
            meaning, so this project uses ``MSE(student, sg(teacher))`` instead, without
            the ``T^2`` factor (this project's choice; docs/methods.md leaves it open).
        reduction: ``batchmean``, the KL per example (docs/methods.md); ``mean`` also averages
            over the ``C`` classes, i.e. ``KL / C``: what RomeBERT's released code computes
            (``nn.KLDivLoss()`` with its default reduction), kept to compare the two scalings.

    Returns:
        Scalar loss.

    Reference:
        Hinton et al. 2015, Distilling the Knowledge in a Neural Network (``T^2`` scaling);
        RomeBERT (Geng et al. 2021), self-distillation term; docs/methods.md, ``SD_k``.
    """
    teacher_logits = teacher_logits.detach()
    if regression:
        return F.mse_loss(_widened(student_logits), _widened(teacher_logits))
    student_log_prob = F.log_softmax(_widened(student_logits) / T, dim=-1)  # [B, C]
    teacher_log_prob = F.log_softmax(_widened(teacher_logits) / T, dim=-1)  # [B, C]
    kl = F.kl_div(student_log_prob, teacher_log_prob, reduction="batchmean", log_target=True)
    if reduction == "mean":  # written out: torch's own "mean" is to become "batchmean"
        kl = kl / student_logits.shape[-1]
    return T**2 * kl


def self_distill_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    gamma: float,
    T: float,
    *,
    regression: bool = False,
    kl_reduction: str = "batchmean",
) -> Tensor:
    """``SD_k = (1 - gamma) * CE(logits_k, y) + gamma * T^2 * KL(sg(p_L^T) || p_k^T)``.

    Args:
        student_logits: logits of exit ``k``, ``[B, C]``.
        teacher_logits: logits of the deepest exit ``L``, ``[B, C]``; detached here.
        labels: ``[B]``, integer classes, or float targets when ``regression``.
        gamma: weight of the distillation term (docs/methods.md default 0.9).
        T: distillation temperature (docs/methods.md default 3).
        regression: STS-B (``C = 1``): CE becomes ``MSE(logits_k, y)`` and the KL term
            becomes ``MSE(logits_k, sg(logits_L))`` without ``T^2`` (this project's choice,
            see :func:`distill_kl`).
        kl_reduction: see :func:`distill_kl`'s ``reduction``.

    Returns:
        Scalar loss.

    Reference:
        RomeBERT (Geng et al. 2021), self-distillation loss; docs/methods.md, ``SD_k``.
    """
    if regression:
        task_loss = F.mse_loss(_widened(student_logits).squeeze(-1), labels.float())
    else:
        task_loss = F.cross_entropy(_widened(student_logits), labels)
    distill = distill_kl(
        student_logits, teacher_logits, T, regression=regression, reduction=kl_reduction
    )
    return (1.0 - gamma) * task_loss + gamma * distill
