"""Gradient rules on hand-built gradients."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aclpipe.training.grad_rules import (
    AclGrad,
    GradientRegularization,
    PlainSum,
    combine_gradients,
    scope_mask,
)

SUM = PlainSum()
ACL_GRAD = AclGrad(max_angle=90.0, scope="encoder")
GR = GradientRegularization(scope="encoder-weights")
RULES = {"sum": SUM, "acl-grad": ACL_GRAD, "gr": GR}


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values)


def flat_dot(a: list, b: list, scoped: list[bool]) -> float:
    return sum(
        float((x * y).sum())
        for x, y, s in zip(a, b, scoped, strict=True)
        if s and x is not None and y is not None
    )


def test_cosine_by_hand_and_sum() -> None:
    # Scoped: main (1, 0 | 2), aux (1, 1 | 0); the third param is out of scope and ignored.
    # <m, a> = 1, ||m|| = 1, ||a|| = sqrt(2): cos = 1/sqrt(2); ratio = sqrt(2).
    main, aux = [t(1.0, 0.0), t(2.0)], [t(1.0, 1.0), t(-5.0)]
    grads, outcome = combine_gradients(SUM, main, aux, [True, False])
    assert outcome.cosine == pytest.approx(1 / math.sqrt(2))
    assert outcome.grad_norm_ratio == pytest.approx(math.sqrt(2))
    assert not outcome.altered
    assert torch.equal(grads[0], t(2.0, 1.0)) and torch.equal(grads[1], t(-3.0))


def test_sum_keeps_going_on_conflict() -> None:
    grads, outcome = combine_gradients(SUM, [t(1.0, 0.0)], [t(-1.0, 0.5)], [True])
    assert outcome.cosine < 0 and not outcome.altered
    assert torch.equal(grads[0], t(0.0, 0.5))


def test_acl_grad_conflict_drops_aux_everywhere() -> None:
    main = [t(1.0, 0.0), t(3.0), None]
    aux = [t(-1.0, 0.2), t(4.0), t(7.0)]  # out-of-scope and aux-only params drop too
    grads, outcome = combine_gradients(ACL_GRAD, main, aux, [True, False, False])
    assert outcome.altered and outcome.cosine < 0
    assert torch.equal(grads[0], t(1.0, 0.0)) and torch.equal(grads[1], t(3.0))
    assert grads[2] is None


def test_acl_grad_no_conflict_sums_and_orthogonal_is_no_conflict() -> None:
    main, aux = [t(1.0, 0.0), None], [t(0.5, 1.0), t(2.0)]
    grads, outcome = combine_gradients(ACL_GRAD, main, aux, [True, True])
    assert not outcome.altered
    assert torch.equal(grads[0], t(1.5, 1.0)) and torch.equal(grads[1], t(2.0))
    _, orthogonal = combine_gradients(ACL_GRAD, [t(1.0, 0.0)], [t(0.0, 1.0)], [True])
    assert orthogonal.cosine == 0.0 and not orthogonal.altered


def test_acl_grad_max_angle() -> None:
    # cos = 0.5 (60 degrees): a conflict under max_angle 45, not under 90 or 75.
    main, aux = [t(1.0, 0.0)], [t(0.5, math.sqrt(3) / 2)]
    for max_angle, conflict in ((45.0, True), (75.0, False), (90.0, False)):
        grads, outcome = combine_gradients(AclGrad(max_angle, "encoder"), main, aux, [True])
        assert outcome.cosine == pytest.approx(0.5)
        assert outcome.altered is conflict
        assert torch.allclose(grads[0], main[0] if conflict else main[0] + aux[0])
    # cos = -0.5 (120 degrees) is tolerated under max_angle 135.
    _, outcome = combine_gradients(AclGrad(135.0, "encoder"), main, [-aux[0]], [True])
    assert not outcome.altered


def test_zero_norms_give_nan_and_no_conflict() -> None:
    grads, outcome = combine_gradients(ACL_GRAD, [t(1.0)], [t(0.0)], [True])
    assert math.isnan(outcome.cosine) and not outcome.altered
    assert outcome.grad_norm_ratio == 0.0 and torch.equal(grads[0], t(1.0))
    grads, outcome = combine_gradients(GR, [None], [t(2.0)], [True])
    assert math.isnan(outcome.cosine) and math.isnan(outcome.grad_norm_ratio)
    assert not outcome.altered and torch.equal(grads[0], t(2.0))
    grads, outcome = combine_gradients(SUM, [None, None], [None, t(1.0)], [True, False])
    assert grads[0] is None and math.isnan(outcome.cosine)


def test_gr_projects_main_on_conflict() -> None:
    # Scoped: g_f = (1, 0 | 1 | 2), g_s = (-1, 1 | 0 | None): <g_f, g_s> = -1,
    # ||g_f|| = sqrt(6), ||g_s||^2 = 2, so cos = -1/sqrt(12) and
    # g_f <- g_f + g_s / 2 = (0.5, 0.5 | 1 | 2), orthogonal to g_s.
    main = [t(1.0, 0.0), t(1.0), t(5.0), t(2.0)]
    aux = [t(-1.0, 1.0), t(0.0), t(-9.0), None]
    scoped = [True, True, False, True]
    grads, outcome = combine_gradients(GR, main, aux, scoped)
    assert outcome.altered
    assert outcome.cosine == pytest.approx(-1 / math.sqrt(12))
    projected = [grads[i] - aux[i] for i in (0, 1)]
    assert torch.allclose(projected[0], t(0.5, 0.5)) and torch.allclose(projected[1], t(1.0))
    assert flat_dot(projected, aux[:2], [True, True]) >= -1e-6
    assert torch.equal(grads[2], t(-4.0))  # out of scope: plain sum, no projection
    assert torch.equal(grads[3], t(2.0))  # main only: unchanged


def test_gr_aux_only_params_unchanged_and_projection_orthogonal() -> None:
    torch.manual_seed(0)
    main = [torch.randn(3, 2), torch.randn(4), None, torch.randn(2)]
    aux = [-main[0] + 0.1 * torch.randn(3, 2), torch.randn(4), torch.randn(5), torch.randn(2)]
    scoped = [True, True, True, False]
    grads, outcome = combine_gradients(GR, main, aux, scoped)
    assert outcome.altered
    assert torch.equal(grads[2], aux[2])  # aux-only (an exit head): its gradient unchanged
    assert torch.equal(grads[3], main[3] + aux[3])
    projected = [grads[0] - aux[0], grads[1] - aux[1], None]
    assert flat_dot(projected, aux[:3], scoped[:3]) >= -1e-6
    assert abs(flat_dot(projected, aux[:3], scoped[:3])) < 1e-5


def test_gr_no_conflict_is_plain_sum() -> None:
    main, aux = [t(1.0, 2.0), None], [t(0.5, 0.0), t(3.0)]
    grads, outcome = combine_gradients(GR, main, aux, [True, True])
    assert not outcome.altered and outcome.cosine > 0
    assert torch.equal(grads[0], t(1.5, 2.0)) and torch.equal(grads[1], t(3.0))


def test_inputs_not_mutated_and_bad_arguments() -> None:
    main, aux = [t(1.0, 0.0)], [t(-1.0, 1.0)]
    for rule in RULES.values():
        combine_gradients(rule, main, aux, [True])
    assert torch.equal(main[0], t(1.0, 0.0)) and torch.equal(aux[0], t(-1.0, 1.0))
    with pytest.raises(ValueError):
        combine_gradients("pcgrad", main, aux, [True])
    with pytest.raises(ValueError):
        combine_gradients(SUM, main, aux, [True, False])
    with pytest.raises(ValueError):
        scope_mask([], "heads")


def test_scope_mask_on_bert_like_names() -> None:
    names_and_shapes = [
        ("encoder.embeddings.word_embeddings.weight", (10, 4)),
        ("encoder.embeddings.LayerNorm.weight", (4,)),
        ("encoder.layer.0.attention.self.query.weight", (4, 4)),
        ("encoder.layer.0.attention.self.query.bias", (4,)),
        ("encoder.layer.0.attention.output.LayerNorm.weight", (4,)),
        ("encoder.layer.1.output.dense.weight", (4, 8)),
        ("encoder.pooler.dense.weight", (4, 4)),
        ("exits.0.classifier.weight", (2, 4)),
        ("exits.0.classifier.bias", (2,)),
    ]
    named = [(name, nn.Parameter(torch.zeros(shape))) for name, shape in names_and_shapes]
    assert scope_mask(named, "all") == [True] * 9
    assert scope_mask(named, "encoder") == [True] * 7 + [False] * 2
    expected = [False, False, True, False, False, True, False, False, False]
    assert scope_mask(named, "encoder-weights") == expected
    prefixed = [("bert." + name, p) for name, p in named]
    assert scope_mask(prefixed, "encoder-weights", encoder_prefix="bert.encoder.") == expected


@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_in_place_equals_out_of_place(name: str, seed: int) -> None:
    """The training loop's in-place combination gives the pure function's result, with
    parameters that only one objective reaches and a mix of conflicts."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(3, 4), (4,), (2, 2), (5,)]
    main = [torch.randn(s, generator=gen) for s in shapes[:3]] + [None]
    aux = [None] + [torch.randn(s, generator=gen) for s in shapes[1:]]
    scoped = [True, True, True, False]
    rule = RULES[name]
    expected, outcome = combine_gradients(rule, main, aux, scoped)
    owned = [None if m is None else m.clone() for m in main]
    got, outcome_in_place = combine_gradients(rule, owned, aux, scoped, in_place=True)
    assert outcome_in_place == outcome
    for e, g in zip(expected, got):
        assert (e is None) == (g is None)
        if e is not None:
            torch.testing.assert_close(g, e)
