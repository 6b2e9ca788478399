"""Running an encoder one layer at a time, exactly as its own forward runs it.

The early-exit runtime, the full-model baseline and the exported exit graphs all run
"embeddings, then layer 1, 2, ..." and read a head after some layers. What a layer takes
besides the hidden states is family business: BERT's layers take an additive attention mask;
MPNet's also the relative position bias its encoder computes once per batch; DeBERTa-v2's a
0/1 mask over token pairs, relative positions and relative embeddings (and, in checkpoints
with a convolution, a conv block after layer 1). A ``LayerRunner`` per family (``RUNNERS``,
keyed by ``config.model_type``) holds that, read off transformers 5's encoder forwards;
``forward_to_exits`` is the one loop over it, and ``check_layerwise`` verifies, once per
model, that the layer run reproduces the model's forward on a probe batch.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from aclpipe.errors import UserError

if TYPE_CHECKING:
    from aclpipe.modeling.model import ExitHead, MultiExitModel

# Layer by layer against forward, logits at every exit, on the probe batch: at most this
# times max(1, the largest |logit|). Measured: 0 on tiny random models of every family in
# RUNNERS and on all-MiniLM-L6-v2 (the same batch, the same kernels); the no-mask shortcut on
# other batches, about 1e-6. A layer fed wrong inputs (no mask, no position bias) is off by
# 1e-4 (a random MPNet's near-zero bias table) to 1e-1 and more.
GUARD_TOLERANCE = 1e-5

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
_verdicts: weakref.WeakKeyDictionary[nn.Module, float] = weakref.WeakKeyDictionary()


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


def forward_to_exits(
    runner: LayerRunner,
    heads: list[ExitHead],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    skip_unpadded_mask: bool = True,
) -> list[torch.Tensor]:
    """Logits ``[B, C]`` of each of ``heads`` (ascending layers): the embeddings, then layers
    ``1..`` the deepest head's, each head read right after its layer.

    ``skip_unpadded_mask``: build no mask when no token is padding (the runtime's shortcut); an
    exported graph keeps the mask (no branch on data)."""
    hidden = runner.embed(input_ids, attention_mask, token_type_ids)  # [B, T, H]
    unpadded = skip_unpadded_mask and bool(attention_mask.all())
    mask = None if unpadded else attention_mask
    inputs = runner.inputs(hidden, mask)
    keep_all = any(head.pooler.reads_all_layers for head in heads)
    at_layer = {head.layer: head for head in heads}
    kept, logits = [hidden], []  # h_0..h_k, or h_k alone when no pooler reads them all
    for depth, call in enumerate(runner.calls[: heads[-1].layer], start=1):
        hidden = call(hidden, inputs)
        kept = kept + [hidden] if keep_all else [hidden]
        if depth in at_layer:
            logits.append(at_layer[depth].logits(kept, mask))  # [B, C]
    return logits


def probe_batches(config) -> list[dict[str, torch.Tensor]]:
    """Two short rows of different lengths (right-padded), then the shorter alone (no padding):
    real token ids above the usual special ids, token types where the model has them."""
    vocab, low = config.vocab_size, min(5, config.vocab_size - 1)
    lengths, batches = [6, 4], []
    ids = torch.zeros(2, 6, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = low + (torch.arange(n) * 7 + row * 3) % (vocab - low)
        mask[row, :n] = 1
    ids[mask == 0] = config.pad_token_id or 0
    types = (torch.arange(6) >= 3).long().expand(2, 6) * mask
    with_types = (getattr(config, "type_vocab_size", 0) or 0) > 1
    for rows, width in ((slice(0, 2), 6), (slice(1, 2), lengths[1])):
        batch = {"input_ids": ids[rows, :width], "attention_mask": mask[rows, :width]}
        if with_types:
            batch["token_type_ids"] = types[rows, :width]
        batches.append(batch)
    return batches


def check_layerwise(model: MultiExitModel) -> float:
    """Raise ``UserError`` unless the layer run reproduces ``model``'s forward: logits at every
    exit on ``probe_batches``, within ``GUARD_TOLERANCE`` (eval mode). Returns the largest
    difference. Run once per model object (the verdict is kept), so building many runtimes
    on one model, as a sweep does, costs one check."""
    if model in _verdicts:
        return _verdicts[model]
    name = type(model.encoder).__name__
    runner = runner_for(model.encoder)
    training = model.training
    model.eval()
    worst, scale = 0.0, 1.0
    try:
        with torch.inference_mode():
            for batch in probe_batches(model.encoder.config):
                expected = model(**batch).logits  # [E, b, C]
                try:
                    got = torch.stack(forward_to_exits(runner, list(model.heads), **batch))
                except Exception as err:  # a layer that takes other inputs fails in many ways
                    reason = (str(err).strip().splitlines() or [""])[0][:200]
                    raise UserError(
                        f"early exit layer by layer cannot run {name}: "
                        f"{type(err).__name__}: {reason}"
                    ) from err
                worst = max(worst, float((got - expected).abs().max()))
                scale = max(scale, float(expected.abs().max()))
    finally:
        model.train(training)
    if not worst <= GUARD_TOLERANCE * scale:  # also catches NaN
        raise UserError(
            f"early exit layer by layer does not reproduce {name}'s forward (max diff "
            f"{worst:.2e} > {GUARD_TOLERANCE * scale:.1e}): its layers need inputs this runner "
            "does not give them; use a supported encoder or extend aclpipe.modeling.layerwise"
        )
    _verdicts[model] = worst
    return worst
