"""Pooling: how exit ``k`` turns hidden states ``h_0..h_k`` into one vector per sample.

Every pooler has the same call: ``pooler(hidden, mask) -> [B, D]`` where ``hidden`` is the
list ``[h_0, ..., h_k]`` of ``[B, T, H]`` tensors (an exit only sees layers already computed)
and ``mask`` is the ``[B, T]`` attention mask, or ``None`` for a batch without padding.
docs/methods.md, Pooling.

Each pooler says which hidden states it reads: ``reads_all_layers`` is True when it needs
``h_0..h_k``; otherwise ``[h_k]`` alone is enough (the layer-by-layer runs keep no more).
``pool`` is the same arithmetic as the call, without module dispatch: inference calls it
after every exit, where at batch 1 each module call costs more Python than the work inside.
"""

from __future__ import annotations

import torch
from torch import nn


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``hidden [B, T, H]`` over the tokens where ``mask [B, T]`` is 1 -> ``[B, H]``.

    ``mask=None`` means no padding (every token counts): the early-exit runtime passes it for
    unpadded batches, where a plain mean is one operation instead of seven."""
    if mask is None:
        return hidden.mean(dim=1)
    weights = mask.unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class ClsPooler(nn.Module):
    """``tanh(W h_k[CLS] + b)``, as BertPooler; one per exit, initialised from the model's own."""

    def __init__(self, hidden_size: int, init_from: nn.Linear | None = None) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        if init_from is not None:
            self.dense.load_state_dict(init_from.state_dict())

    reads_all_layers = False

    def pool(self, hidden: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[-1][:, 0]))  # [B, H]

    def forward(self, hidden: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        return self.pool(hidden, mask)


class MeanPooler(nn.Module):
    """Masked mean of ``h_k`` over tokens (how sentence-transformers checkpoints were trained)."""

    reads_all_layers = False

    def pool(self, hidden: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        return masked_mean(hidden[-1], mask)  # [B, H]

    def forward(self, hidden: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        return self.pool(hidden, mask)


def layer_summaries(
    hidden: list[torch.Tensor], mask: torch.Tensor | None, cls_from_mean: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer query and key/value sources for layer-wise attention pooling.

    Returns ``(heads, means)``, both ``[B, k+1, H]`` for ``hidden = [h_0, ..., h_k]``:
    ``heads[:, j]`` is ``h_j[CLS]`` (or the masked mean of ``h_j`` when ``cls_from_mean``, for
    mean-pooled checkpoints whose [CLS] carries little, docs/methods.md, Pooling) and ``means[:, j]``
    is the masked mean of ``h_j``.
    """
    means = torch.stack([masked_mean(h, mask) for h in hidden], dim=1)  # [B, k+1, H]
    if cls_from_mean:
        return means, means
    heads = torch.stack([h[:, 0] for h in hidden], dim=1)  # [B, k+1, H]
    return heads, means


def attend_over_layers(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over layers with one query per layer, merged into one distribution per sample.

    Each layer's query ``i`` scores every layer's key ``j``: ``s_ij = q_i . k_j / (k+1)``
    (Oh et al. 2022 scale by the number of layers, not by ``sqrt(H)``), and
    ``a_i = softmax_j(s_i)``. The per-query results are averaged; since every query attends
    over the same values, averaging the attended vectors ``sum_j a_ij v_j`` (as the authors'
    released code does) equals attending once with the mean distribution ``w_j = mean_i a_ij``,
    which is what we compute and return.

    Args:
        queries: ``[B, k+1, H]``, one per layer.
        keys: ``[B, k+1, H]``.
        values: ``[B, k+1, H]``.

    Returns:
        ``(attended [B, H], weights [B, k+1])``; each row of ``weights`` sums to 1.
    """
    num_layers = keys.shape[1]  # k + 1
    scores = torch.einsum("bih,bjh->bij", queries, keys) / num_layers  # [B, k+1, k+1]
    weights = scores.float().softmax(dim=-1).mean(dim=1).to(values.dtype)  # [B, k+1]
    attended = torch.einsum("bj,bjh->bh", weights, values)  # [B, H]
    return attended, weights


class LayerAttentionPooler(nn.Module):
    """Layer-wise attention pooling (Oh et al., COLING 2022) for exit ``k``.

    Exit ``k`` receives ``hidden = [h_0, ..., h_k]`` only (an exit sees the layers it has
    computed; a list of any other length is an error). With ``c_j = h_j[CLS]`` and
    ``m_j`` the masked mean of ``h_j`` over tokens (``j = 0..k``)::

        q_j = RReLU(W_q c_j),  k_j = RReLU(W_k m_j),  v_j = RReLU(W_v m_j)   (no bias)
        a_ij = softmax_j(q_i . k_j / (k+1))           one distribution per query layer i
        w_j = mean_i a_ij                             one distribution per sample
        z_k = tanh(W_o [c_k ; sum_j w_j v_j] + b_o)   W_o: 2H -> H

    How the ``k+1`` queries become one distribution: every layer's [CLS] query attends over
    all ``k+1`` layers and the attended vectors are averaged, as in the authors' released code
    (nlpods/LayerAttPooler); that equals attending once with the mean of the per-query
    distributions (``attend_over_layers``). The Q/K/V maps have no bias and ``[c_k ; .]``
    puts the [CLS] vector first, also as released. RReLU samples its negative slopes in
    training mode (a mild noise, like dropout) and uses their mean, 11/48, in eval mode.

    With ``cls_from_mean=True`` the masked mean ``m_j`` stands wherever ``c_j`` would (queries
    and the concatenated ``c_k``): for mean-pooled checkpoints such as all-MiniLM-L6-v2,
    whose [CLS] vector is nearly constant below the last layers (docs/methods.md, Pooling).

    Args:
        hidden_size: ``H``, the encoder's hidden size.
        layer: ``k``, the exit's layer (1-based; ``h_0`` is the embeddings).
        cls_from_mean: use masked means in place of [CLS] vectors.

    Inputs:
        hidden: ``[h_0, ..., h_k]``, each ``[B, T, H]``; mask: ``[B, T]``.

    Returns:
        ``[B, H]``.
    """

    reads_all_layers = True

    def __init__(self, hidden_size: int, layer: int, cls_from_mean: bool = False) -> None:
        super().__init__()
        self.layer = layer
        self.cls_from_mean = cls_from_mean
        self.query = nn.Sequential(nn.Linear(hidden_size, hidden_size, bias=False), nn.RReLU())
        self.key = nn.Sequential(nn.Linear(hidden_size, hidden_size, bias=False), nn.RReLU())
        self.value = nn.Sequential(nn.Linear(hidden_size, hidden_size, bias=False), nn.RReLU())
        self.dense = nn.Linear(2 * hidden_size, hidden_size)

    def attend(
        self, hidden: list[torch.Tensor], mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(attended [B, H], weights [B, k+1], c_k [B, H])`` before the output map."""
        if len(hidden) != self.layer + 1:
            raise ValueError(
                f"exit {self.layer} pools h_0..h_{self.layer} ({self.layer + 1} tensors), "
                f"got {len(hidden)}"
            )
        heads, means = layer_summaries(hidden, mask, self.cls_from_mean)  # [B, k+1, H] each
        queries = self.query(heads)  # [B, k+1, H]
        keys = self.key(means)  # [B, k+1, H]
        values = self.value(means)  # [B, k+1, H]
        attended, weights = attend_over_layers(queries, keys, values)  # [B, H], [B, k+1]
        return attended, weights, heads[:, -1]

    def pool(self, hidden: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        attended, _, head_k = self.attend(hidden, mask)  # [B, H], _, [B, H]
        return torch.tanh(self.dense(torch.cat([head_k, attended], dim=-1)))  # [B, H]

    def forward(self, hidden: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        return self.pool(hidden, mask)


def parameter_free_layer_attention(
    hidden: list[torch.Tensor], mask: torch.Tensor | None, cls_from_mean: bool = False
) -> torch.Tensor:
    """Layer-attention pooling with no learned weights, for zero-shot sentence embeddings.

    ``LayerAttentionPooler`` with each "linear map + RReLU" replaced by the identity (queries
    ``c_j``, keys and values ``m_j``), the same ``1/(k+1)`` scale and the same averaging of
    per-query distributions, returning the attended vector ``sum_j w_j m_j`` itself: the
    output map ``W_o`` has no pretrained value, so it is left out. The result is a convex
    combination of the layers' mean vectors, weighted by how well each layer's mean matches
    the layers' [CLS] vectors (or means, with ``cls_from_mean``). ``[B, H]``.
    """
    heads, means = layer_summaries(hidden, mask, cls_from_mean)  # [B, k+1, H] each
    attended, _ = attend_over_layers(heads, means, means)  # [B, H]
    return attended
