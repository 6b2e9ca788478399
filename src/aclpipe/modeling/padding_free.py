"""Padding-free training forward: the encoder's linear layers run on real tokens only.

A batch of B rows right-padded to T tokens holds N = (real tokens) <= B x T positions. In a
BERT layer nearly all the arithmetic is per token (query, key, value, the attention output
projection and the feed-forward: 12 H^2 multiply-adds a token against 2 T H for attention),
and a padded position's result is thrown away. Here the layers keep the hidden states packed
as ``[N, H]`` (the real tokens, row after row); only attention, which mixes tokens within a
row, sees the padded ``[B, heads, T, d]`` layout, by a scatter before it and a gather after
it. This is the idea of "padding-free" training (Hugging Face's
``DataCollatorWithFlattening``, which needs flash attention, unavailable on CPU; ByteTransformer's
"zero padding" on GPUs), written for the BERT layer stack of transformers 5.

The result equals the encoder's own forward at every real token up to float rounding (padded
positions hold zeros here and arbitrary values there; no pooler reads them): tested against
``encoder(..., output_hidden_states=True)`` on tiny random models, logits and gradients.
Dropout draws differ from the padded forward's (other tensor shapes), so training is the same
in distribution, not bitwise.

Families: those whose layers are BERT's (``BertLayer`` and its copies: BERT, MiniLM, RoBERTa,
ELECTRA without an embedding projection), with absolute positions (``unsupported`` says why
another is not); ``train.padding_free: auto`` uses it where it applies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from aclpipe.errors import UserError
from aclpipe.modeling.layerwise import additive_mask

FAMILIES = ("bert", "roberta", "electra")


def unsupported(encoder: nn.Module) -> str | None:
    """Why ``padding_free_hidden_states`` cannot run ``encoder`` exactly, or ``None``."""
    config = encoder.config
    model_type = getattr(config, "model_type", "?")
    if model_type not in FAMILIES:
        return f"model type {model_type!r} is not one of {', '.join(FAMILIES)}"
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return f"position_embedding_type {config.position_embedding_type!r} is not absolute"
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "it is a decoder"
    if getattr(encoder, "embeddings_project", None) is not None:
        return "its embeddings are projected (ELECTRA with embedding_size != hidden_size)"
    if getattr(config, "chunk_size_feed_forward", 0):
        return "it chunks its feed-forward"
    return None


def use_padding_free(setting: str | bool, encoder: nn.Module) -> bool:
    """``train.padding_free`` for this encoder: ``auto`` = where supported; ``True`` on an
    unsupported family is a one-line ``UserError``."""
    if setting is False:
        return False
    reason = unsupported(encoder)
    if reason and setting is True:
        raise UserError(
            f"train.padding_free cannot run {type(encoder).__name__}: {reason}; set "
            "train.padding_free to auto or false"
        )
    return reason is None


def padding_free_hidden_states(
    encoder: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """``[h_0, ..., h_L]``, each ``[B, T, H]`` with zeros at padding, as
    ``encoder(..., output_hidden_states=True).hidden_states`` at every real token.

    ``attention_mask`` is the ``[B, T]`` 0/1 mask of right-padded rows."""
    batch, width = attention_mask.shape
    real = attention_mask.reshape(-1).bool()  # [B*T]
    where = real.nonzero().squeeze(1)  # [N] flat positions of the real tokens
    kwargs = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
    padded = encoder.embeddings(input_ids=input_ids, **kwargs)  # [B, T, H]
    hidden_size = padded.shape[-1]
    x = padded.reshape(batch * width, hidden_size).index_select(0, where)  # [N, H]
    bias = additive_mask(attention_mask, x.dtype)  # [B, 1, 1, T], for the padded attention

    def unpack(flat: torch.Tensor) -> torch.Tensor:  # [N, H] -> [B, T, H], zeros at padding
        return _scatter(flat, where, batch * width).view(batch, width, -1)

    states = [unpack(x)]
    layers = encoder.encoder.layer
    for layer in layers:
        x = _layer(layer, x, where, bias, batch, width)  # [N, H]
        states.append(unpack(x))
    return states


def _layer(
    layer: nn.Module,
    x: torch.Tensor,  # [N, H]
    where: torch.Tensor,  # [N]
    bias: torch.Tensor,  # [B, 1, 1, T]
    batch: int,
    width: int,
) -> torch.Tensor:
    """``BertLayer.forward`` on packed tokens (transformers 5, modeling_bert.py): self-attention
    with its output projection, dropout and residual LayerNorm; feed-forward likewise."""
    attention = layer.attention.self
    heads, head_size = attention.num_attention_heads, attention.attention_head_size

    def padded_heads(flat: torch.Tensor) -> torch.Tensor:  # [N, H] -> [B, heads, T, d]
        out = _scatter(flat, where, batch * width)
        return out.view(batch, width, heads, head_size).transpose(1, 2)

    q = padded_heads(attention.query(x))
    k = padded_heads(attention.key(x))
    v = padded_heads(attention.value(x))
    p = attention.dropout.p if attention.training else 0.0
    mixed = F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias, dropout_p=p, scale=attention.scaling
    )  # [B, heads, T, d]
    mixed = mixed.transpose(1, 2).reshape(batch * width, heads * head_size).index_select(0, where)
    out = layer.attention.output  # BertSelfOutput: dense, dropout, LayerNorm(+ input)
    x = out.LayerNorm(_dropout(out.dropout, out.dense(mixed), where, batch * width) + x)
    inner = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(x))  # [N, I]
    ffn = layer.output  # BertOutput
    return ffn.LayerNorm(_dropout(ffn.dropout, ffn.dense(inner), where, batch * width) + x)


def _dropout(module: nn.Dropout, flat: torch.Tensor, where: torch.Tensor, rows: int):
    """``module`` applied as on the padded ``[B*T, H]`` tensor: the mask is drawn over every
    position, padding included, so the random stream and each real token's mask are those of
    the padded forward (training then matches it draw for draw); identity in eval mode."""
    if not module.training or module.p == 0:
        return flat
    return module(_scatter(flat, where, rows)).index_select(0, where)  # [N, H]


def _scatter(flat: torch.Tensor, where: torch.Tensor, rows: int) -> torch.Tensor:
    """Packed ``[N, X]`` -> ``[rows, X]`` with row ``where[i]`` = ``flat[i]``, zeros elsewhere."""
    return flat.new_zeros(rows, flat.shape[-1]).index_copy(0, where, flat)
