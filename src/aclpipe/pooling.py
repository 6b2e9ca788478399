"""Pooling: how exit ``k`` turns hidden states ``h_0..h_k`` into one vector per sample.

Every pooler has the same call: ``pooler(hidden, mask) -> [B, D]`` where ``hidden`` is the
list ``[h_0, ..., h_k]`` of ``[B, T, H]`` tensors (an exit only sees layers already computed)
and ``mask`` is the ``[B, T]`` attention mask. METHODS.md, Pooling.
"""

from __future__ import annotations

import torch
from torch import nn


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden [B, T, H]`` over the tokens where ``mask [B, T]`` is 1 -> ``[B, H]``."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class ClsPooler(nn.Module):
    """``tanh(W h_k[CLS] + b)``, as BertPooler; one per exit, initialised from the model's own."""

    def __init__(self, hidden_size: int, init_from: nn.Linear | None = None) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        if init_from is not None:
            self.dense.load_state_dict(init_from.state_dict())

    def forward(self, hidden: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[-1][:, 0]))  # [B, H]


class MeanPooler(nn.Module):
    """Masked mean of ``h_k`` over tokens (how sentence-transformers checkpoints were trained)."""

    def forward(self, hidden: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        return masked_mean(hidden[-1], mask)  # [B, H]
