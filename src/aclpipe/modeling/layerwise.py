"""Running an encoder one layer at a time, exactly as its own forward runs it.

The early-exit runtime, the full-model baseline and the exported exit graphs all run
"embeddings, then layer 1, 2, ..." and read a head after some layers. What a layer takes
besides the hidden states is family business: BERT's layers take an additive attention mask;
MPNet's also the relative position bias its encoder computes once per batch; DeBERTa-v2's a
0/1 mask over token pairs, relative positions and relative embeddings (and, in checkpoints
with a convolution, a conv block after layer 1). A ``LayerRunner`` per family (``RUNNERS``,
keyed by ``config.model_type``) holds that, read off transformers 5's encoder forwards.
These runners sit below the model: ``aclpipe.modeling.model.forward_to_exits`` is the one loop
over them that reads the exit heads, and ``aclpipe.modeling.layer_guard`` verifies, once per
model, that the layer run reproduces the model's forward on a probe batch.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from aclpipe.errors import UserError

LayerCall = Callable[[torch.Tensor, Any], torch.Tensor]  # (hidden [B, T, H], inputs) -> hidden


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, T]`` 0/1 attention mask -> ``[B, 1, 1, T]`` additive mask for the layers."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class LayerRunner:
    """BERT, RoBERTa, ELECTRA, DistilBERT (MiniLM is a BERT): ``layer(hidden, additive mask)``.

    ``embed`` gives ``h_0``; ``inputs(hidden, mask)`` what every layer of this batch takes
    besides the hidden states (computed once per batch, again when the runtime shrinks it);
    ``calls[i]`` runs layer ``i + 1``: ``hidden = calls[i](hidden, inputs)``. ``mask`` is the
    ``[B, T]`` 0/1 mask, or ``None`` when no token is padding (then no mask is built: adding
    an all-zero mask changes nothing).
    """

    def __init__(self, encoder: nn.Module) -> None:
        self.encoder = encoder
        self.owner, self.layers = _layer_stack(encoder)
        accepted = inspect.signature(encoder.embeddings.forward).parameters
        self.embeds_token_types = "token_type_ids" in accepted
        # ELECTRA with embedding_size != hidden_size projects h_0 (ElectraModel.forward)
        self.project = getattr(encoder, "embeddings_project", None)
        self.calls: list[LayerCall] = [
            self.layer_call(i, layer) for i, layer in enumerate(self.layers)
        ]

    def embed(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """``h_0``, the embedding output ``[B, T, H]``."""
        if token_type_ids is not None and self.embeds_token_types:
            hidden = self.encoder.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        else:
            hidden = self.encoder.embeddings(input_ids=input_ids)
        return hidden if self.project is None else self.project(hidden)

    def inputs(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> Any:
        return None if mask is None else additive_mask(mask, hidden.dtype)  # [B, 1, 1, T]

    def layer_call(self, index: int, layer: nn.Module) -> LayerCall:
        def call(hidden: torch.Tensor, mask4d: torch.Tensor | None) -> torch.Tensor:
            out = layer(hidden, mask4d)
            return out[0] if isinstance(out, tuple) else out  # [B, T, H]

        return call

    def modules(self, depth: int) -> dict[str, nn.Module]:
        """The modules the embeddings and layers ``1..depth`` read (an exit graph holds these):
        the embeddings, the encoder's other parts (ELECTRA's projection, MPNet's position bias
        table, DeBERTa's relative embeddings) and the first ``depth`` layers."""
        parts = {name: m for name, m in self.encoder.named_children() if m is not self.owner}
        parts.update((name, m) for name, m in self.owner.named_children() if name != "layer")
        parts["layers"] = nn.ModuleList(self.layers[:depth])
        return parts


class MPNetRunner(LayerRunner):
    """MPNet: every layer also takes the relative position bias ``[B, heads, T, T]`` that
    ``MPNetEncoder.forward`` computes once from the hidden states' shape."""

    def inputs(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> Any:
        bias = self.owner.compute_position_bias(hidden)  # [B, heads, T, T]
        return (None if mask is None else additive_mask(mask, hidden.dtype), bias)

    def layer_call(self, index: int, layer: nn.Module) -> LayerCall:
        def call(hidden: torch.Tensor, inputs: tuple) -> torch.Tensor:
            return layer(hidden, inputs[0], inputs[1])[0]  # [B, T, H]

        return call


class DebertaV2Runner(LayerRunner):
    """DeBERTa-v2/v3 (``DebertaV2Model.forward`` and ``DebertaV2Encoder.forward``): the
    embeddings are zeroed at padding; every layer takes the 0/1 pair mask ``[B, 1, T, T]``,
    the relative positions and the (normalised) relative embeddings; a conv block, where the
    checkpoint has one, follows layer 1 with the layer's input as its input."""

    def __init__(self, encoder: nn.Module) -> None:
        if getattr(encoder, "z_steps", 0) > 1:
            raise UserError(
                "early exit layer by layer does not support DeBERTa with z_steps > 1 "
                "(its last layer runs again): use a checkpoint with z_steps 0"
            )
        super().__init__(encoder)

    def embed(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        return self.encoder.embeddings(
            input_ids=input_ids, token_type_ids=token_type_ids, mask=attention_mask
        )  # [B, T, H]

    def inputs(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> Any:
        if mask is None:  # DebertaV2Model takes a missing mask as all ones
            mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
        encoder = self.owner
        pairs = encoder.get_attention_mask(mask)  # [B, 1, T, T]
        return pairs, encoder.get_rel_pos(hidden), encoder.get_rel_embedding(), mask

    def layer_call(self, index: int, layer: nn.Module) -> LayerCall:
        conv = self.owner.conv if index == 0 else None

        def call(hidden: torch.Tensor, inputs: tuple) -> torch.Tensor:
            pairs, relative_pos, rel_embeddings, mask = inputs
            out = layer(hidden, pairs, relative_pos=relative_pos, rel_embeddings=rel_embeddings)
            return out[0] if conv is None else conv(hidden, out[0], mask)  # [B, T, H]

        return call


RUNNERS: dict[str, type[LayerRunner]] = {
    "bert": LayerRunner,
    "roberta": LayerRunner,
    "electra": LayerRunner,
    "distilbert": LayerRunner,
    "mpnet": MPNetRunner,
    "deberta-v2": DebertaV2Runner,
}

_runners: weakref.WeakKeyDictionary[nn.Module, LayerRunner] = weakref.WeakKeyDictionary()


def _layer_stack(encoder: nn.Module) -> tuple[nn.Module, nn.ModuleList]:
    for owner in ("encoder", "transformer"):  # BERT-likes, MPNet, DeBERTa / DistilBERT
        stack = getattr(getattr(encoder, owner, None), "layer", None)
        if isinstance(stack, nn.ModuleList):
            return getattr(encoder, owner), stack
    raise UserError(f"{type(encoder).__name__} has no encoder.layer list to run layer by layer")


def runner_for(encoder: nn.Module) -> LayerRunner:
    """The encoder's ``LayerRunner`` (one per encoder object); a one-line error for a family
    outside ``RUNNERS``."""
    runner = _runners.get(encoder)
    if runner is None:
        model_type = getattr(encoder.config, "model_type", "?")
        if model_type not in RUNNERS:
            raise UserError(
                f"early exit layer by layer is not supported for {type(encoder).__name__} "
                f"(model type {model_type!r}): use one of {', '.join(RUNNERS)}"
            )
        runner = _runners[encoder] = RUNNERS[model_type](encoder)
    return runner
