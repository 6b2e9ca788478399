"""cosine-pairs: SetFit's cosine-similarity objective and its logistic-regression head refit,
each against a plain reference written here, and the method end to end on the tiny model
(train, refit, export-exits' ONNX chain, early-exit predict)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import ok
from paths import at
from sklearn.linear_model import LogisticRegression

from aclpipe.data.prepared import load_split
from aclpipe.errors import UserError
from aclpipe.layout import EXPORT_JSON
from aclpipe.modeling.backbone import load_encoder, load_tokenizer
from aclpipe.modeling.model import ExitSpec, MultiExitModel, load_multi_exit
from aclpipe.training.head_refit import LogisticRefit, exit_features, fit_logistic, refit_heads
from aclpipe.training.objectives import cosine_pairs_loss

LABELS = [[0, 1], [0, 0, 0], [0, 1, 0, 1, 1], [2, 0, 1, 2, 1, 0], [1] * 7 + [0]]


def reference_loss(features: list[list[float]], labels: list[int]) -> float:
    """The mean over every pair i < j of (cos(z_i, z_j) - [y_i == y_j])^2, one pair at a time."""
    total, pairs = 0.0, 0
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            a, b = features[i], features[j]
            dot = sum(x * y for x, y in zip(a, b))
            cos = dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))
            total += (cos - (1.0 if labels[i] == labels[j] else 0.0)) ** 2
            pairs += 1
    return total / pairs


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("labels", LABELS)
def test_loss_matches_a_plain_reference(labels: list[int], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    features = 3 * torch.randn(len(labels), 5, generator=g, dtype=torch.float64)  # [B, D]
    loss = cosine_pairs_loss(features, torch.tensor(labels))
    assert float(loss) == pytest.approx(reference_loss(features.tolist(), labels), rel=1e-12)


def test_loss_gradient_and_the_batch_of_one() -> None:
    features = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 1, 1, 0])
    assert torch.autograd.gradcheck(lambda z: cosine_pairs_loss(z, labels), (features,))
    one = torch.randn(1, 4, requires_grad=True)
    loss = cosine_pairs_loss(one, torch.tensor([1]))
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.equal(one.grad, torch.zeros_like(one))


@pytest.mark.parametrize("C", [0.1, 1.0, 10.0])
@pytest.mark.parametrize("num_labels", [2, 3])
def test_fitted_head_gives_scikit_learns_probabilities(num_labels: int, C: float) -> None:
    rng = np.random.default_rng(num_labels)
    labels = np.arange(40) % num_labels  # [N], every class
    features = rng.normal(size=(40, 6)) + labels[:, None]  # [N, D], classes apart
    weight, bias, converged = fit_logistic(features, labels, num_labels, LogisticRefit(C, 1000))
    assert converged and weight.shape == (num_labels, 6) and bias.shape == (num_labels,)
    logits = features @ weight.T + bias  # [N, C]
    ours = np.exp(logits - logits.max(1, keepdims=True))
    ours /= ours.sum(1, keepdims=True)
    reference = LogisticRegression(C=C, max_iter=1000).fit(features, labels)
    np.testing.assert_allclose(ours, reference.predict_proba(features), atol=1e-9)


def test_fit_needs_every_class() -> None:
    with pytest.raises(UserError, match="each of the 3 classes"):
        fit_logistic(np.ones((4, 2)), np.array([0, 1, 0, 1]), 3, LogisticRefit(1.0, 100))


SENTENCES = ["good film", "bad film", "a very good plot", "a very bad plot", "so good",
             "so bad", "good acting and a good story", "bad acting"]  # fmt: skip


def tiny_rows(tiny_model_dir: Path) -> list[dict]:
    encoded = load_tokenizer(str(tiny_model_dir))(SENTENCES)
    return [{"input_ids": ids, "token_type_ids": types, "label": i % 2}
            for i, (ids, types) in enumerate(zip(encoded["input_ids"],
                                                  encoded["token_type_ids"]))]  # fmt: skip


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_refit_heads_matches_scikit_learn_per_exit(tiny_model_dir: Path, pooling: str) -> None:
    torch.manual_seed(0)
    spec = ExitSpec(num_labels=2, exits=[1, 2, 3], pooling=pooling, dropout=0.1)
    model = MultiExitModel(load_encoder(str(tiny_model_dir)), spec)
    encoder_before = {n: p.clone() for n, p in model.encoder.named_parameters()}
    rows = tiny_rows(tiny_model_dir)
    converged = refit_heads(model, LogisticRefit(1.0, 1000), rows, 0, 3, "cpu")
    assert converged == [True, True, True]
    assert all(torch.equal(p, encoder_before[n]) for n, p in model.encoder.named_parameters())
    model.eval()
    labels = [row["label"] for row in rows]
    for k in range(3):
        # the reference: scikit-learn on this exit's features, each row encoded alone
        features = np.stack([one_row(model, row)[1][k] for row in rows])  # [N, D]
        expected = LogisticRegression(C=1.0, max_iter=1000).fit(features, labels)
        for row, x in zip(rows, features):
            got = torch.softmax(one_row(model, row)[0][k].double(), -1).numpy()  # [C]
            np.testing.assert_allclose(got, expected.predict_proba(x[None])[0], atol=1e-4)


@torch.no_grad()
def one_row(model: MultiExitModel, row: dict) -> tuple[torch.Tensor, np.ndarray]:
    """Logits ``[E, C]`` and features ``[E, D]`` of one row alone (no padding)."""
    ids = torch.tensor([row["input_ids"]])
    out = model(ids, torch.ones_like(ids), torch.tensor([row["token_type_ids"]]))
    return out.logits[:, 0], out.features[:, 0].double().numpy()


def test_refit_refuses_regression(tiny_model_dir: Path) -> None:
    spec = ExitSpec(num_labels=1, exits=[3], pooling="mean", dropout=0.1)
    model = MultiExitModel(load_encoder(str(tiny_model_dir)), spec)
    with pytest.raises(UserError, match="regression"):
        refit_heads(model, LogisticRefit(1.0, 100), tiny_rows(tiny_model_dir), 0, 4, "cpu")


@pytest.mark.slow  # trains on the tiny model, exports six ONNX graphs, predicts
def test_trained_refit_exported_and_exited_early(tmp_path: Path, make_project, monkeypatch):
    project = make_project(tmp_path / "project", pipeline={"tasks": ["sst2"]},
                           model={"pooling": "mean"}, train={"epochs": 2, "batch_size": 4})  # fmt: skip
    monkeypatch.chdir(project)
    ok("finetune", "--task", "sst2", "--method", "cosine-pairs")
    model_dir = at(project).model("sst2", "cosine-pairs")
    model = load_multi_exit(model_dir).eval()
    assert model.spec.exits == [1, 2, 3]
    # every exit's head is scikit-learn's regression on that exit's features of the train rows
    rows = load_split(at(project).data("sst2"), "train")
    features = exit_features(model, rows, 0, 64, "cpu")  # [E, N, D]
    labels = np.array([row["label"] for row in rows])
    for head, exit_x in zip(model.heads, features):
        reference = LogisticRegression(C=1.0, max_iter=1000).fit(exit_x, labels)
        weight = head.classifier.weight.detach().numpy()  # [2, D]
        np.testing.assert_allclose(weight[1] - weight[0], reference.coef_[0], atol=1e-3)
    ok("export-exits", "--task", "sst2", "--method", "cosine-pairs")
    report = json.loads((at(project).export("sst2", "cosine-pairs") / EXPORT_JSON).read_text())
    assert report["exits"] == [1, 2, 3]
    gaps = [s[k] for s in report["segments"] for k in s if k.startswith(("max_abs", "chain_max"))]
    assert gaps and all(0 <= gap < 1e-4 for gap in gaps)
    (project / "in.txt").write_text("a good film\na bad plot\n", encoding="utf-8")
    ok("predict", "--model", str(at(project).export("sst2", "cosine-pairs")), "--input",
       "in.txt", "--output", "out.jsonl", "--policy", "confidence", "--threshold", "0.5")  # fmt: skip
    records = [json.loads(line) for line in (project / "out.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["exit_layer"] in (1, 2, 3) for r in records)
