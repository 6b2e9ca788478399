"""Objectives against plain, slow references that spell out docs/methods.md's formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from aclpipe.training.objectives import (
    acl_embed_loss,
    cross_layer_acl_loss,
    distill_kl,
    scl_loss,
    self_distill_loss,
    supcon,
)


@pytest.fixture(autouse=True)
def seed() -> None:
    torch.manual_seed(0)


def reference_supcon(anchors, anchor_labels, pool, pool_labels, tau, anchor_in_pool=None):
    """docs/methods.md's l(a), literally: a loop over anchors and positives, in float64 math."""
    losses = []
    for i in range(len(anchors)):
        self_index = -1 if anchor_in_pool is None else int(anchor_in_pool[i])
        others = [q for q in range(len(pool)) if q != self_index]
        positives = [q for q in others if int(pool_labels[q]) == int(anchor_labels[i])]
        if not positives:
            continue  # left out: no positive
        sim = [float(anchors[i] @ pool[q]) / tau for q in range(len(pool))]
        denominator = sum(math.exp(sim[q]) for q in others)
        terms = [math.log(math.exp(sim[p]) / denominator) for p in positives]
        losses.append(-sum(terms) / len(positives))
    return sum(losses) / len(losses) if losses else 0.0


def unit(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x, dim=-1)


def test_supcon_hand_checked() -> None:
    # Three 2-D unit vectors, all anchors and pool: a=(1,0) label 0, b=(0,1) label 0,
    # c=(-1,0) label 1; tau = 1. Anchor a: positive b, sims to b, c = 0, -1, so
    # l(a) = -log(e^0 / (e^0 + e^-1)) = log(1 + e^-1). Anchor b: positive a, sims to a, c
    # are 0, 0: l(b) = log 2. Anchor c has no positive. Loss = (log(1 + 1/e) + log 2) / 2.
    vectors = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    labels = torch.tensor([0, 0, 1])
    loss = supcon(vectors, labels, vectors, labels, 1.0, anchor_in_pool=torch.arange(3))
    expected = (math.log(1 + math.exp(-1)) + math.log(2)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("tau", [0.01, 0.05, 0.3, 1.0])
def test_supcon_matches_reference_with_partial_membership(tau: float) -> None:
    anchors = unit(torch.randn(5, 4))
    pool = unit(torch.randn(7, 4))
    anchor_labels = torch.tensor([0, 1, 2, 1, 0])
    pool_labels = torch.tensor([0, 1, 1, 0, 2, 2, 1])
    pool[2], pool[6] = anchors[1], anchors[3]  # anchors 1 and 3 are pool members
    anchor_in_pool = torch.tensor([-1, 2, -1, 6, -1])
    loss = supcon(anchors, anchor_labels, pool, pool_labels, tau, anchor_in_pool)
    expected = reference_supcon(anchors, anchor_labels, pool, pool_labels, tau, anchor_in_pool)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_supcon_no_positive_anywhere_is_zero_with_zero_gradient() -> None:
    anchors = unit(torch.randn(3, 4)).requires_grad_()
    loss = supcon(
        anchors, torch.tensor([0, 1, 2]), anchors, torch.tensor([0, 1, 2]), 0.1, torch.arange(3)
    )
    assert loss.item() == 0.0
    (grad,) = torch.autograd.grad(loss, anchors)
    assert torch.equal(grad, torch.zeros_like(anchors))


def test_scl_matches_reference_and_is_permutation_invariant() -> None:
    features = torch.randn(8, 6)
    labels = torch.tensor([0, 1, 1, 0, 2, 1, 0, 0])
    loss = scl_loss(features, labels, 0.3)
    u = unit(features)
    expected = reference_supcon(u, labels, u, labels, 0.3, torch.arange(8))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    order = torch.randperm(8)
    assert scl_loss(features[order], labels[order], 0.3).item() == pytest.approx(loss.item())


def test_scl_anchor_without_positive_is_left_out() -> None:
    features = torch.randn(5, 4)
    labels = torch.tensor([0, 0, 1, 1, 2])  # class 2 has one sample: no positive
    loss = scl_loss(features, labels, 0.3)
    u = unit(features)
    expected = reference_supcon(u, labels, u, labels, 0.3, torch.arange(5))
    assert torch.isfinite(loss)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_scl_single_class_batch() -> None:
    features = torch.randn(4, 3, requires_grad=True)
    loss = scl_loss(features, torch.zeros(4, dtype=torch.long), 0.3)
    # Every other sample is a positive, and the denominator runs over exactly those.
    u = unit(features.detach())
    zeros = torch.zeros(4, dtype=torch.long)
    assert loss.item() == pytest.approx(reference_supcon(u, zeros, u, zeros, 0.3, torch.arange(4)))
    loss.backward()
    assert torch.isfinite(features.grad).all()


def test_scl_batch_of_one_is_zero_with_zero_gradient() -> None:
    features = torch.randn(1, 5, requires_grad=True)
    loss = scl_loss(features, torch.tensor([1]), 0.3)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(features.grad, torch.zeros_like(features))


def test_acl_embed_matches_reference() -> None:
    features, embeddings = torch.randn(6, 5), torch.randn(4, 5)
    labels = torch.tensor([0, 1, 1, 0, 3, 0])  # class 2 is absent: its embedding is left out
    loss = acl_embed_loss(features, labels, embeddings, 0.1)
    pool = torch.cat([unit(features), unit(embeddings)])
    pool_labels = torch.cat([labels, torch.arange(4)])
    expected = reference_supcon(pool, pool_labels, pool, pool_labels, 0.1, torch.arange(10))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    order = torch.randperm(6)
    permuted = acl_embed_loss(features[order], labels[order], embeddings, 0.1)
    assert permuted.item() == pytest.approx(loss.item(), rel=1e-6)


def test_acl_embed_hand_checked() -> None:
    # One sample u=(1,0) of class 0, embeddings e0=(1,0), e1=(0,1); tau = 1. Pool {u, e0, e1}.
    # Anchor u: positive e0, sims to e0, e1 = 1, 0: l(u) = -log(e / (e + 1)).
    # Anchor e0: positive u, same sims: l(e0) = -log(e / (e + 1)). e1 has no positive.
    loss = acl_embed_loss(
        torch.tensor([[2.0, 0.0]]), torch.tensor([0]), torch.tensor([[3.0, 0.0], [0.0, 0.5]]), 1.0
    )
    assert loss.item() == pytest.approx(-math.log(math.e / (math.e + 1)), abs=1e-6)


def test_acl_embed_batch_of_one_and_single_class() -> None:
    features = torch.randn(1, 4, requires_grad=True)
    embeddings = torch.randn(3, 4, requires_grad=True)
    loss = acl_embed_loss(features, torch.tensor([2]), embeddings, 0.1)
    loss.backward()
    assert torch.isfinite(loss) and loss.item() > 0
    assert features.grad.abs().sum() > 0 and torch.isfinite(embeddings.grad).all()
    single = acl_embed_loss(torch.randn(5, 4), torch.ones(5, dtype=torch.long), embeddings, 0.1)
    assert torch.isfinite(single)


def test_cross_layer_matches_reference() -> None:
    student, teacher, embeddings = torch.randn(6, 5), torch.randn(6, 5), torch.randn(3, 5)
    labels = torch.tensor([0, 2, 2, 1, 0, 0])
    loss = cross_layer_acl_loss(student, teacher, labels, embeddings, 0.1)
    pool = torch.cat([unit(teacher), unit(embeddings)])
    pool_labels = torch.cat([labels, torch.arange(3)])
    # Anchors are not pool members: own teacher feature is a positive, nothing excluded.
    expected = reference_supcon(unit(student), labels, pool, pool_labels, 0.1)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    order = torch.randperm(6)
    permuted = cross_layer_acl_loss(student[order], teacher[order], labels[order], embeddings, 0.1)
    assert permuted.item() == pytest.approx(loss.item(), rel=1e-6)


def test_cross_layer_gradient_reaches_only_the_student() -> None:
    student = torch.randn(1, 4, requires_grad=True)  # a batch of one: still has positives
    teacher = torch.randn(1, 4, requires_grad=True)
    embeddings = torch.randn(2, 4, requires_grad=True)
    loss = cross_layer_acl_loss(student, teacher, torch.tensor([1]), embeddings, 0.1)
    student_grad, teacher_grad, embedding_grad = torch.autograd.grad(
        loss, [student, teacher, embeddings], allow_unused=True
    )
    assert torch.isfinite(loss) and student_grad.abs().sum() > 0
    assert teacher_grad is None and embedding_grad is None


def reference_self_distill(student, teacher, labels, gamma, T):
    """SD_k with a hand-written softmax, cross-entropy and KL, averaged over the batch."""
    ce, kl = 0.0, 0.0
    for s_row, t_row, y in zip(student.tolist(), teacher.tolist(), labels.tolist(), strict=True):
        p_s = [math.exp(v) / sum(math.exp(w) for w in s_row) for v in s_row]
        ce += -math.log(p_s[y])
        q_s = [math.exp(v / T) / sum(math.exp(w / T) for w in s_row) for v in s_row]
        q_t = [math.exp(v / T) / sum(math.exp(w / T) for w in t_row) for v in t_row]
        kl += sum(t * math.log(t / s) for t, s in zip(q_t, q_s, strict=True))
    n = len(labels)
    return (1 - gamma) * ce / n + gamma * T**2 * kl / n


def test_self_distill_matches_reference() -> None:
    student, teacher = torch.randn(5, 3), torch.randn(5, 3)
    labels = torch.tensor([0, 2, 1, 1, 0])
    loss = self_distill_loss(student, teacher, labels, 0.9, 3.0)
    expected = reference_self_distill(student, teacher, labels, 0.9, 3.0)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_self_distill_gamma_zero_is_cross_entropy() -> None:
    student, teacher = torch.randn(4, 3), torch.randn(4, 3)
    labels = torch.tensor([0, 1, 2, 1])
    loss = self_distill_loss(student, teacher, labels, 0.0, 3.0)
    assert loss.item() == pytest.approx(F.cross_entropy(student, labels).item(), rel=1e-6)


def test_distill_kl_t_squared_scaling_and_stop_gradient() -> None:
    student = torch.randn(4, 3, requires_grad=True)
    teacher = torch.randn(4, 3, requires_grad=True)
    for T in (1.0, 2.0, 4.0):
        kl = F.kl_div(
            F.log_softmax(student / T, -1), F.softmax(teacher / T, -1), reduction="batchmean"
        )
        assert distill_kl(student, teacher, T).item() == pytest.approx(T**2 * kl.item(), rel=1e-5)
    _, teacher_grad = torch.autograd.grad(
        distill_kl(student, teacher, 3.0), [student, teacher], allow_unused=True
    )
    assert teacher_grad is None
    assert distill_kl(teacher, teacher, 3.0).item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("classes", [2, 3, 5])
def test_kl_mean_reduction_is_romeberts_kl_over_classes(classes: int) -> None:
    """``kl_reduction: mean`` (RomeBERT's released code, nn.KLDivLoss() defaults) is the
    per-example KL divided by the number of classes; only the KL part of SD_k changes."""
    student, teacher = torch.randn(6, classes), torch.randn(6, classes)
    labels = torch.randint(0, classes, (6,))
    per_example = distill_kl(student, teacher, 3.0)
    # the slow way: sum over examples and classes of p_t (log p_t - log p_s), over B * C
    p_t = F.softmax(teacher / 3.0, -1)
    by_hand = (p_t * (p_t.log() - F.log_softmax(student / 3.0, -1))).sum() / (6 * classes)
    mean = distill_kl(student, teacher, 3.0, reduction="mean")
    assert mean.item() == pytest.approx(9.0 * by_hand.item(), rel=1e-5)
    assert mean.item() == pytest.approx(per_example.item() / classes, rel=1e-5)
    ce = F.cross_entropy(student, labels)
    sd = self_distill_loss(student, teacher, labels, 0.9, 3.0, kl_reduction="mean")
    assert sd.item() == pytest.approx(0.1 * ce.item() + 0.9 * mean.item(), rel=1e-5)


def test_self_distill_batch_of_one_and_regression() -> None:
    loss = self_distill_loss(torch.randn(1, 2), torch.randn(1, 2), torch.tensor([1]), 0.9, 3.0)
    assert torch.isfinite(loss)
    student, teacher = torch.randn(4, 1), torch.randn(4, 1)
    targets = torch.rand(4) * 5
    loss = self_distill_loss(student, teacher, targets, 0.9, 3.0, regression=True)
    expected = 0.1 * F.mse_loss(student[:, 0], targets) + 0.9 * F.mse_loss(student, teacher)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
