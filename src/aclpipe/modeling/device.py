"""Where the model runs: one reading of ``train.device`` for training, scoring and the study."""

from __future__ import annotations

import torch

from aclpipe.errors import UserError


def pick_device(setting: str) -> str:
    """``"cuda"`` or ``"cpu"`` for a ``train.device`` setting (``auto | cpu | cuda``).

    ``auto`` takes the GPU when one is visible; ``cuda`` without a visible GPU is a
    ``UserError`` rather than a silent fall-back to the CPU.
    """
    if setting == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device is cuda but no GPU is visible: set train.device=auto or cpu")
    if setting == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return "cuda"
