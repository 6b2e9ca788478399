"""Where a stage runs: ``train.device`` (auto | cpu | cuda) turned into a torch device name."""

from __future__ import annotations

from aclpipe.errors import UserError


def pick_device(setting: str) -> str:
    """``cuda`` when ``setting`` is cuda, or auto and a GPU is visible; else ``cpu``."""
    import torch

    gpu = torch.cuda.is_available()
    if setting == "cuda" and not gpu:
        raise UserError("train.device is cuda but no GPU is visible: set train.device=auto or cpu")
    return "cuda" if setting == "cuda" or (setting == "auto" and gpu) else "cpu"
