"""Layer-wise attention pooling against a plain per-sample, per-layer reference."""

from __future__ import annotations

import math

import pytest
import torch

from aclpipe.modeling.pooling import (
    LayerAttentionPooler,
    attend_over_layers,
    parameter_free_layer_attention,
)

B, T, H = 3, 5, 8


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


def make_inputs(layer: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    hidden = [torch.randn(B, T, H) for _ in range(layer + 1)]  # h_0..h_k
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])  # [B, T]
    return hidden, mask


def leaky(x: torch.Tensor) -> torch.Tensor:
    # nn.RReLU in eval mode: a leaky ReLU with the mean slope (1/8 + 1/3) / 2 = 11/48.
    return torch.where(x >= 0, x, x * (11 / 48))


def reference(pooler: LayerAttentionPooler, hidden, mask) -> torch.Tensor:
    """The pooler written out per sample and per layer, averaging attended vectors per query."""
    w_q, w_k, w_v = pooler.query[0].weight, pooler.key[0].weight, pooler.value[0].weight
    outputs = []
    for b in range(B):
        tokens = [t for t in range(T) if mask[b, t] == 1]
        means = [sum(h[b, t] for t in tokens) / len(tokens) for h in hidden]
        heads = means if pooler.cls_from_mean else [h[b, 0] for h in hidden]
        keys = [leaky(w_k @ m) for m in means]
        values = [leaky(w_v @ m) for m in means]
        attended_per_query = []
        for head in heads:
            query = leaky(w_q @ head)
            scores = [float(query @ key) / len(hidden) for key in keys]
            total = sum(math.exp(s) for s in scores)
            attended_per_query.append(
                sum(math.exp(s) / total * v for s, v in zip(scores, values, strict=True))
            )
        attended = sum(attended_per_query) / len(heads)
        outputs.append(torch.tanh(pooler.dense(torch.cat([heads[-1], attended]))))
    return torch.stack(outputs)


@pytest.mark.parametrize("layer", [1, 3])
@pytest.mark.parametrize("cls_from_mean", [False, True])
def test_matches_reference(layer: int, cls_from_mean: bool) -> None:
    pooler = LayerAttentionPooler(H, layer, cls_from_mean).eval()
    hidden, mask = make_inputs(layer)
    out = pooler(hidden, mask)
    assert out.shape == (B, H)
    with torch.no_grad():
        assert torch.allclose(out, reference(pooler, hidden, mask), atol=1e-5)


def test_only_layers_up_to_k() -> None:
    layer = 2
    pooler = LayerAttentionPooler(H, layer).eval()
    hidden, mask = make_inputs(layer + 1)  # h_0..h_3: one layer too deep for exit 2
    with pytest.raises(ValueError, match="h_0..h_2"):
        pooler(hidden, mask)
    base = pooler(hidden[: layer + 1], mask)
    for j in range(layer + 1):  # every layer it does receive matters
        changed = [h.clone() for h in hidden[: layer + 1]]
        changed[j][:, 0] += 1.0  # [CLS] (query, and c_k for j = k)
        changed[j][:, 1] += 1.0  # a real token of every sample (key and value)
        assert not torch.allclose(pooler(changed, mask), base, atol=1e-6)


@pytest.mark.parametrize("cls_from_mean", [False, True])
def test_padding_does_not_matter(cls_from_mean: bool) -> None:
    pooler = LayerAttentionPooler(H, 2, cls_from_mean).eval()
    hidden, mask = make_inputs(2)
    padded = mask.unsqueeze(-1) == 0  # [B, T, 1]
    noisy = [torch.where(padded, 100 * torch.randn_like(h), h) for h in hidden]
    assert torch.allclose(pooler(hidden, mask), pooler(noisy, mask), atol=1e-6)
    assert torch.allclose(
        parameter_free_layer_attention(hidden, mask, cls_from_mean),
        parameter_free_layer_attention(noisy, mask, cls_from_mean),
        atol=1e-6,
    )


def test_weights_are_a_distribution_and_average_per_query() -> None:
    pooler = LayerAttentionPooler(H, 3).eval()
    hidden, mask = make_inputs(3)
    attended, weights, _ = pooler.attend(hidden, mask)
    assert weights.shape == (B, 4)
    assert (weights >= 0).all()
    assert torch.allclose(weights.sum(dim=-1), torch.ones(B), atol=1e-6)
    # Hand-checked: equal keys give every layer the same score, so weights are uniform.
    queries, keys = torch.randn(1, 4, H), torch.ones(1, 4, H)
    values = torch.arange(4.0).view(1, 4, 1).expand(1, 4, H)
    attended, weights = attend_over_layers(queries, keys, values)
    assert torch.allclose(weights, torch.full((1, 4), 0.25))
    assert torch.allclose(attended, torch.full((1, H), 1.5))


def test_cls_from_mean_uses_mean_vectors() -> None:
    hidden, mask = make_inputs(2)
    pooler = LayerAttentionPooler(H, 2, cls_from_mean=True).eval()
    base = pooler(hidden, mask)
    # Changing only the [CLS] position while keeping each mean the same: shift token 0 up and
    # token 1 down by the same amount (both are real tokens for every sample).
    shifted = [h.clone() for h in hidden]
    for h in shifted:
        h[:, 0] += 3.0
        h[:, 1] -= 3.0
    assert torch.allclose(pooler(shifted, mask), base, atol=1e-5)
    with_cls = LayerAttentionPooler(H, 2, cls_from_mean=False).eval()
    with_cls.load_state_dict(pooler.state_dict())
    assert not torch.allclose(with_cls(shifted, mask), with_cls(hidden, mask), atol=1e-3)
    _, _, head = pooler.attend(hidden, mask)
    expected = (hidden[-1] * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
    assert torch.allclose(head, expected, atol=1e-6)


def test_gradient_reaches_every_parameter() -> None:
    pooler = LayerAttentionPooler(H, 2).train()  # RReLU samples slopes in training mode
    hidden, mask = make_inputs(2)
    hidden = [h.requires_grad_() for h in hidden]
    pooler(hidden, mask).pow(2).sum().backward()
    for name, param in pooler.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    assert all(h.grad is not None and h.grad.abs().sum() > 0 for h in hidden)


def test_parameter_free_is_a_convex_mix_of_layer_means() -> None:
    hidden, mask = make_inputs(2)
    means = torch.stack(
        [(h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True) for h in hidden], dim=1
    )  # [B, k+1, H]
    heads = torch.stack([h[:, 0] for h in hidden], dim=1)  # [B, k+1, H]
    scores = heads @ means.transpose(1, 2) / 3  # [B, k+1, k+1]
    weights = scores.softmax(-1).mean(1)  # [B, k+1]
    expected = (weights.unsqueeze(-1) * means).sum(1)  # [B, H]
    assert torch.allclose(parameter_free_layer_attention(hidden, mask), expected, atol=1e-5)
