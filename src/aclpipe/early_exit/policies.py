"""Exit policies: pure, per-sample decisions over the logits a sample has seen so far.

``leaves(policy, threshold, window, ...)`` says whether one sample leaves at its newest exit,
looking only at that sample's logits at its exits so far. Nothing is stored on a model and
nothing is decided per batch (docs/methods.md, Exit policies):

| policy | leaves at the first exit k where | threshold |
| --- | --- | --- |
| entropy | ``H(p_k) < S`` (natural log) | ``S`` in ``[0, log C]`` |
| patience | the argmax was the same at exits ``k-t .. k`` (regression: ``abs(diff) < eps``) | ``t >= 1`` |
| confidence | ``max p_k >= delta`` | ``delta`` in ``[0, 1]`` |

A sample that meets no criterion leaves at the last exit; the setting ``none`` (``NO_EXIT``)
sends every sample there (the full model). The early-exit runtime and the offline sweep over
all-exit logits (``exit_indices``) both call ``leaves``, so they decide alike.

The decision is plain Python arithmetic on one sample's few logits. The runtime makes it
after every exit, right after a transformer layer: there, each torch or NumPy call on a tiny
tensor costs about 100 us (its code has been pushed out of the CPU caches by the layer),
while the interpreter's own arithmetic stays warm. Measured on MiniLM at batch 1
(benchmarks/early_exit_speed.py's setting): the confidence check took 143 us with NumPy
and 21 us in Python, a twentieth of a layer saved at every exit.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from aclpipe.errors import UserError

if TYPE_CHECKING:
    import torch

POLICIES = ("entropy", "patience", "confidence")
NO_EXIT = "none"  # the setting without early exit: every sample runs to the last exit


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


def leaves(
    policy: str, threshold: float, window: list[list[float]], regression: bool, eps: float
) -> bool:
    """Whether one sample leaves at its newest exit.

    ``window`` is the sample's logits at its last exits, oldest first, newest last (one list
    of ``C`` floats per exit; the runtime keeps ``t + 1`` of them for patience ``t``, one for
    the others). With ``m = max_c z_c`` and ``s = sum_c exp(z_c - m)``, the softmax is
    ``p_c = exp(z_c - m) / s``, so ``max_c p_c = 1 / s`` and
    ``H(p) = log s - sum_c p_c (z_c - m)``: exact, with no ``log 0`` to guard.
    """
    if policy == "patience":
        t = int(threshold)
        if len(window) < t + 1:
            return False
        recent = window[-(t + 1) :]
        if regression:
            return all(abs(b[0] - a[0]) < eps for a, b in zip(recent, recent[1:]))
        first = [row.index(max(row)) for row in recent]  # argmax, first of ties
        return all(c == first[-1] for c in first)
    newest = window[-1]
    top = max(newest)
    shifted = [z - top for z in newest]
    exp = [math.exp(d) for d in shifted]
    total = sum(exp)  # >= 1: the top class contributes exp(0)
    if policy == "confidence":
        return 1.0 / total >= threshold
    entropy = math.log(total) - sum(e * d for e, d in zip(exp, shifted)) / total
    return entropy < threshold


def window_size(policy: str, threshold: float) -> int:
    """How many of a sample's newest exits the policy reads: ``t + 1`` for patience ``t``, else
    one."""
    return int(threshold) + 1 if policy == "patience" else 1


def step(
    policy: str,
    threshold: float,
    windows: list[list[list[float]]],
    rows: list[list[float]],
    size: int,
    regression: bool,
    eps: float,
) -> tuple[list[list[list[float]]], list[bool]]:
    """One exit of a runtime, for the samples still running: each sample's window with its
    newest logits (``rows``, one list of ``C`` floats per sample) appended and only the newest
    ``size`` kept, and whether it leaves there. Both engines (PyTorch and ONNX Runtime) call it.

    ``(w + [row])[-size:]``, not ``w[len(w) + 1 - size:] + [row]``: early on that start index
    is negative and counts from the end, so patience ``t >= 3`` never saw ``t + 1`` exits."""
    windows = [(w + [row])[-size:] for w, row in zip(windows, rows)]
    return windows, [leaves(policy, threshold, w, regression, eps) for w in windows]


def check_policy(policy: str, regression: bool) -> None:
    if policy not in POLICIES:
        raise UserError(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
    if regression and policy != "patience":
        raise UserError(f"policy {policy!r} needs class probabilities: use patience for STS-B")


def exit_indices(
    policy: str,
    threshold: float | None,
    logits: np.ndarray | torch.Tensor,
    regression: bool = False,
    eps: float = 0.1,
) -> np.ndarray:
    """Exit index (0-based into the exits) of every sample, from all-exit logits ``[E, N, C]``;
    ``policy`` may also be ``NO_EXIT`` (every sample at the last exit, no threshold)."""
    if policy != NO_EXIT:
        check_policy(policy, regression)
    if hasattr(logits, "detach"):  # a torch tensor; this module imports no torch (serving)
        logits = logits.detach().cpu().numpy()
    logits = np.asarray(logits)
    num_exits = logits.shape[0]
    chosen = np.full(logits.shape[1], num_exits - 1, dtype=np.int64)
    if policy == NO_EXIT:
        return chosen
    for i, rows in enumerate(logits.transpose(1, 0, 2).tolist()):  # one sample's [E][C]
        for k in range(num_exits - 1):
            if leaves(policy, threshold, rows[: k + 1], regression, eps):
                chosen[i] = k
                break
    return chosen


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
