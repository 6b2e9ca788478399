"""GLUE metrics, computed locally with scikit-learn and scipy (no metric downloads).

GLUE's conventions (docs/methods.md, "Scores"): CoLA Matthews correlation; SST-2, QNLI, RTE,
WNLI, MNLI accuracy; MRPC and QQP accuracy and F1 of the positive class 1; STS-B Pearson and
Spearman. A task's score is the mean of its metrics. Degenerate inputs (constant predictions,
no positives) give 0 rather than NaN, so that a collapsed exit scores 0 instead of poisoning
an average over exits.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import stats
from sklearn.metrics import confusion_matrix, f1_score

from aclpipe.data.tasks import Task


def _accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(predictions == labels))


def _f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    # F1 of class 1; with no predicted and no true positives sklearn would warn, we return 0.
    return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0))


def _mcc(predictions: np.ndarray, labels: np.ndarray) -> float:
    # Matthews correlation from the confusion matrix (Gorodkin's multiclass form, as sklearn's
    # matthews_corrcoef), written out because sklearn warns when only one class occurs.
    classes = np.union1d(np.union1d(labels, predictions), [0, 1])
    cm = confusion_matrix(labels, predictions, labels=classes).astype(np.float64)  # [K, K]
    true_counts, pred_counts = cm.sum(axis=1), cm.sum(axis=0)  # [K], [K]
    n, correct = cm.sum(), np.trace(cm)
    covariance = correct * n - true_counts @ pred_counts
    denominator = math.sqrt(
        (n * n - true_counts @ true_counts) * (n * n - pred_counts @ pred_counts)
    )
    # An empty row or column (e.g. constant predictions) leaves MCC undefined; GLUE takes 0.
    return float(covariance / denominator) if denominator > 0 else 0.0


def _correlation(kind: str, predictions: np.ndarray, labels: np.ndarray) -> float:
    # Constant input makes the correlation undefined (scipy warns and returns NaN): call it 0.
    if len(labels) < 2 or np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    fn = stats.pearsonr if kind == "pearson" else stats.spearmanr
    value = float(fn(predictions, labels)[0])
    return value if math.isfinite(value) else 0.0  # e.g. NaN predictions from a diverged run


_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": _accuracy,
    "f1": _f1,
    "mcc": _mcc,
    "pearson": lambda p, y: _correlation("pearson", p, y),
    "spearman": lambda p, y: _correlation("spearman", p, y),
}


def compute_metrics(task: Task, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The task's GLUE metrics (``task.metrics``) for one set of predictions.

    Args:
        task: the GLUE task; its ``metrics`` say which metrics to compute.
        predictions: ``[N]`` class indices, or float scores for STS-B.
        labels: ``[N]`` gold class indices, or gold float scores for STS-B.

    Returns:
        ``{metric name: value}`` in ``task.metrics`` order; every value is finite.
    """
    predictions = np.asarray(predictions)  # [N]
    labels = np.asarray(labels)  # [N]
    if predictions.shape != labels.shape or predictions.ndim != 1:
        raise ValueError(
            f"predictions {predictions.shape} and labels {labels.shape} must be equal 1-D shapes"
        )
    if len(labels) == 0:
        raise ValueError("no examples to score")
    if task.is_regression:
        predictions, labels = predictions.astype(np.float64), labels.astype(np.float64)
    else:
        predictions, labels = predictions.astype(np.int64), labels.astype(np.int64)
    return {name: _METRICS[name](predictions, labels) for name in task.metrics}


def task_score(task: Task, metrics: dict[str, float]) -> float:
    """The task's score: the mean of its GLUE metrics (GLUE's convention)."""
    missing = [name for name in task.metrics if name not in metrics]
    if missing:
        raise ValueError(f"metrics for {task.name} lack {', '.join(missing)}")
    return float(np.mean([metrics[name] for name in task.metrics]))


def logits_to_predictions(task: Task, logits: np.ndarray) -> np.ndarray:
    """Class indices (argmax over the last axis), or the scores for regression.

    ``logits`` is ``[..., C]`` (e.g. ``[B, C]`` or ``[E, B, C]``); the result is ``[...]``.
    For STS-B, ``C`` is 1 and the single output is the predicted score; scores that are
    already squeezed (a last axis wider than 1) are returned as they are.
    """
    logits = np.asarray(logits)
    if task.is_regression:
        scores = logits[..., 0] if logits.ndim and logits.shape[-1] == 1 else logits
        return scores.astype(np.float64)  # [...]
    return logits.argmax(axis=-1)  # [...]
