"""GLUE metrics against values worked out by hand on tiny arrays."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from aclpipe.data.tasks import TASKS
from aclpipe.evaluation.metrics import compute_metrics, logits_to_predictions, task_score


@pytest.fixture(autouse=True)
def no_warnings():
    """Degenerate inputs must be handled, not warned about (sklearn/scipy warn on 0/0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_accuracy() -> None:
    # Correct at positions 0, 1 and 3: 3/4.
    metrics = compute_metrics(TASKS["rte"], np.array([1, 0, 1, 1]), np.array([1, 0, 0, 1]))
    assert metrics == {"accuracy": pytest.approx(3 / 4)}
    assert task_score(TASKS["rte"], metrics) == pytest.approx(0.75)


def test_accuracy_and_f1() -> None:
    predictions = np.array([1, 1, 0, 1, 0])
    labels = np.array([1, 0, 1, 1, 0])
    # tp = 2 (positions 0, 3), fp = 1 (position 1), fn = 1 (position 2), tn = 1 (position 4).
    # precision = 2/3, recall = 2/3, F1 = 2 * tp / (2 * tp + fp + fn) = 4/6 = 2/3.
    # accuracy = (tp + tn) / 5 = 3/5.
    metrics = compute_metrics(TASKS["mrpc"], predictions, labels)
    assert list(metrics) == ["accuracy", "f1"]
    assert metrics["accuracy"] == pytest.approx(3 / 5)
    assert metrics["f1"] == pytest.approx(2 / 3)
    # score = (3/5 + 2/3) / 2 = (9/15 + 10/15) / 2 = 19/30.
    assert task_score(TASKS["mrpc"], metrics) == pytest.approx(19 / 30)


def test_f1_positive_class_is_one() -> None:
    # Swapping the roles of 0 and 1 changes F1: here tp = 1, fp = 0, fn = 2 -> 2/(2+0+2) = 1/2.
    metrics = compute_metrics(TASKS["qqp"], np.array([1, 0, 0, 0]), np.array([1, 1, 1, 0]))
    assert metrics["f1"] == pytest.approx(1 / 2)


def test_mcc() -> None:
    predictions = np.array([1, 1, 0, 1, 0, 0])
    labels = np.array([1, 0, 1, 1, 0, 0])
    # tp = 2, fp = 1, fn = 1, tn = 2.
    # MCC = (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)) = (4 - 1) / sqrt(3^4) = 1/3.
    metrics = compute_metrics(TASKS["cola"], predictions, labels)
    assert metrics == {"mcc": pytest.approx(1 / 3)}
    assert task_score(TASKS["cola"], metrics) == pytest.approx(1 / 3)


def test_pearson_and_spearman() -> None:
    predictions = np.array([1.0, 2.0, 3.0, 4.0])
    labels = np.array([2.0, 5.0, 4.0, 9.0])
    # Pearson: deviations from the means (2.5 and 5) are dx = [-1.5, -.5, .5, 1.5] and
    # dy = [-3, 0, -1, 4]; sum(dx*dy) = 4.5 + 0 - 0.5 + 6 = 10, sum(dx^2) = 5, sum(dy^2) = 26,
    # r = 10 / sqrt(5 * 26) = 10 / sqrt(130).
    # Spearman: ranks [1, 2, 3, 4] vs [1, 3, 2, 4], d = [0, -1, 1, 0], sum(d^2) = 2,
    # rho = 1 - 6 * 2 / (4 * (16 - 1)) = 1 - 12/60 = 0.8.
    metrics = compute_metrics(TASKS["stsb"], predictions, labels)
    assert list(metrics) == ["pearson", "spearman"]
    assert metrics["pearson"] == pytest.approx(10 / math.sqrt(130))
    assert metrics["spearman"] == pytest.approx(0.8)
    assert task_score(TASKS["stsb"], metrics) == pytest.approx((10 / math.sqrt(130) + 0.8) / 2)


def test_every_task_returns_its_metrics() -> None:
    for task in TASKS.values():
        values = np.array([0, 1, 1, 0])
        metrics = compute_metrics(task, values, values)
        assert list(metrics) == list(task.metrics)
        assert task_score(task, metrics) == pytest.approx(1.0)  # perfect predictions


@pytest.mark.parametrize(
    ("name", "predictions", "labels", "expected"),
    [
        # Constant predictions: the confusion matrix has an empty column, MCC is defined as 0.
        ("cola", [1, 1, 1, 1], [1, 0, 1, 0], {"mcc": 0.0}),
        ("cola", [0, 0, 0], [0, 0, 0], {"mcc": 0.0}),
        # No predicted and no true positives: tp = fp = fn = 0, F1 taken as 0.
        ("mrpc", [0, 0, 0], [0, 0, 0], {"accuracy": 1.0, "f1": 0.0}),
        # True positives exist but none predicted: F1 = 0, accuracy = 1/3.
        ("qqp", [0, 0, 0], [1, 1, 0], {"accuracy": 1 / 3, "f1": 0.0}),
        # Constant predictions or constant labels: correlation undefined, taken as 0.
        ("stsb", [2.5, 2.5, 2.5], [1.0, 3.0, 4.0], {"pearson": 0.0, "spearman": 0.0}),
        ("stsb", [1.0, 3.0, 4.0], [2.0, 2.0, 2.0], {"pearson": 0.0, "spearman": 0.0}),
        ("stsb", [1.0], [2.0], {"pearson": 0.0, "spearman": 0.0}),
        # A diverged regression head.
        ("stsb", [np.nan, 1.0, 2.0], [1.0, 2.0, 3.0], {"pearson": 0.0, "spearman": 0.0}),
    ],
)
def test_degenerate_cases_are_finite(
    name: str, predictions: list, labels: list, expected: dict[str, float]
) -> None:
    metrics = compute_metrics(TASKS[name], np.array(predictions), np.array(labels))
    assert metrics == pytest.approx(expected)
    assert all(math.isfinite(v) for v in metrics.values())


def test_bad_shapes_and_missing_metrics() -> None:
    with pytest.raises(ValueError, match="shapes"):
        compute_metrics(TASKS["rte"], np.array([0, 1]), np.array([0, 1, 1]))
    with pytest.raises(ValueError, match="no examples"):
        compute_metrics(TASKS["rte"], np.array([]), np.array([]))
    with pytest.raises(ValueError, match="f1"):
        task_score(TASKS["mrpc"], {"accuracy": 0.5})


def test_logits_to_predictions() -> None:
    logits = np.array([[0.1, 0.9], [2.0, 1.0], [-1.0, -3.0]])  # [B, C]
    assert logits_to_predictions(TASKS["sst2"], logits).tolist() == [1, 0, 0]
    exits = np.stack([logits, -logits])  # [E, B, C]
    assert logits_to_predictions(TASKS["sst2"], exits).tolist() == [[1, 0, 0], [0, 1, 1]]
    three = np.array([[0.0, 0.1, 0.2], [5.0, 0.0, 0.0]])  # [B, 3]
    assert logits_to_predictions(TASKS["mnli"], three).tolist() == [2, 0]
    scores = np.array([[3.2], [1.0]])  # [B, 1]
    assert logits_to_predictions(TASKS["stsb"], scores).tolist() == [3.2, 1.0]
    assert logits_to_predictions(TASKS["stsb"], np.array([3.2, 1.0])).tolist() == [3.2, 1.0]
    exit_scores = np.zeros((2, 3, 1))  # [E, B, 1]
    assert logits_to_predictions(TASKS["stsb"], exit_scores).shape == (2, 3)


def test_mcc_matches_sklearn_reference() -> None:
    from sklearn.metrics import matthews_corrcoef

    rng = np.random.default_rng(0)
    for _ in range(50):
        labels, predictions = rng.integers(0, 2, size=(2, 16))  # [2, N]
        if len(set(labels)) == 1 or len(set(predictions)) == 1:
            continue  # sklearn warns there; covered by the degenerate cases
        expected = matthews_corrcoef(labels, predictions)
        assert compute_metrics(TASKS["cola"], predictions, labels)["mcc"] == pytest.approx(expected)
