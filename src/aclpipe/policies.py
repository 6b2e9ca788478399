"""Exit policies: pure, per-sample decisions over the logits a sample has seen so far.

``exits_now(policy, threshold, seen)`` says, for each sample of a batch, whether it leaves at
the newest exit, looking only at that sample's logits at exits ``0..k`` (``seen [k+1, B, C]``).
Nothing is stored on a model and nothing is decided per batch (METHODS.md, Exit policies):

| policy | leaves at the first exit k where | threshold |
| --- | --- | --- |
| entropy | ``H(p_k) < S`` (natural log) | ``S`` in ``[0, log C]`` |
| patience | the argmax was the same at exits ``k-t .. k`` (regression: ``abs(diff) < eps``) | ``t >= 1`` |
| confidence | ``max p_k >= delta`` | ``delta`` in ``[0, 1]`` |

A sample that meets no criterion leaves at the last exit. The early-exit runtime and the
offline sweep over all-exit logits both call ``exits_now``, so they decide alike.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from aclpipe.errors import UserError

POLICIES = ("entropy", "patience", "confidence")


def check_threshold(policy: str, threshold: float, num_labels: int, num_exits: int) -> None:
    """A one-line error for an unknown policy or a threshold outside its range."""
    if policy not in POLICIES:
        raise UserError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
    if policy == "entropy" and not 0 <= threshold <= math.log(max(num_labels, 2)) + 1e-9:
        raise UserError(
            f"entropy threshold {threshold} is outside [0, log C] = [0, "
            f"{math.log(max(num_labels, 2)):.3f}]: pick a value in that range"
        )
    if policy == "confidence" and not 0 <= threshold <= 1:
        raise UserError(f"confidence threshold {threshold} is outside [0, 1]")
    if policy == "patience" and (threshold < 1 or threshold != int(threshold)):
        raise UserError(
            f"patience {threshold} must be a whole number >= 1 (at most {num_exits - 1} "
            "with this model's exits)"
        )


def exits_now(
    policy: str, threshold: float, seen: torch.Tensor, regression: bool = False, eps: float = 0.1
) -> torch.Tensor:
    """Which samples leave at the newest exit.

    Args:
        policy: entropy | patience | confidence.
        threshold: ``S``, ``t`` or ``delta`` (see the module table).
        seen: logits at exits ``0..k`` of the samples still running, ``[k+1, B, C]``.
        regression: STS-B-style single output; only ``patience`` applies (``abs(diff) < eps``).
        eps: patience tolerance for regression outputs.

    Returns:
        ``[B]`` bool: True where the sample leaves at exit ``k``. The caller makes the last
        exit leave every sample that is left.
    """
    newest = seen[-1].float()  # [B, C]
    if policy == "patience":
        t = int(threshold)
        if seen.shape[0] < t + 1:
            return torch.zeros(newest.shape[0], dtype=torch.bool, device=seen.device)
        window = seen[-(t + 1) :].float()  # [t+1, B, C]
        if regression:
            steps = (window[1:, :, 0] - window[:-1, :, 0]).abs()  # [t, B]
            return (steps < eps).all(dim=0)
        predictions = window.argmax(dim=-1)  # [t+1, B]
        return (predictions == predictions[-1]).all(dim=0)
    if regression:
        raise UserError(f"policy {policy!r} needs class probabilities: use patience for STS-B")
    probs = newest.softmax(dim=-1)  # [B, C]
    if policy == "entropy":
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(dim=-1)  # [B]
        return entropy < threshold
    if policy == "confidence":
        return probs.max(dim=-1).values >= threshold
    raise UserError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")


def exit_indices(
    policy: str,
    threshold: float,
    logits: np.ndarray | torch.Tensor,
    regression: bool = False,
    eps: float = 0.1,
) -> np.ndarray:
    """Exit index (0-based into the exits) of every sample, from all-exit logits ``[E, N, C]``."""
    logits = logits.detach().cpu() if torch.is_tensor(logits) else torch.as_tensor(logits)
    num_exits, n = logits.shape[0], logits.shape[1]
    chosen = torch.full((n,), num_exits - 1, dtype=torch.long)
    running = torch.ones(n, dtype=torch.bool)
    for k in range(num_exits - 1):
        leave = exits_now(policy, threshold, logits[: k + 1], regression, eps) & running
        chosen[leave] = k
        running &= ~leave
    return chosen.numpy()


def default_grid(policy: str, num_labels: int, num_exits: int, points: int = 11) -> list[float]:
    """Thresholds spanning each policy's useful range (entropy 0..log C, patience 1..E-1,
    confidence 0.5..1.0)."""
    if policy == "entropy":
        top = math.log(max(num_labels, 2))
        return [round(top * i / (points - 1), 6) for i in range(points)]
    if policy == "confidence":
        return [round(0.5 + 0.5 * i / (points - 1), 6) for i in range(points)]
    if policy == "patience":
        return [float(t) for t in range(1, max(num_exits, 2))]
    raise UserError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
