"""Exit heads refit by logistic regression on the trained encoder's frozen features.

SetFit (Tunstall et al. 2022) trains its sentence encoder first and its classifier after, a
logistic regression on the frozen embeddings of the same few examples. ``refit_heads`` does
that for every exit of a ``MultiExitModel``: it pools each exit's features of the training
rows in eval mode (no dropout) and writes the fitted weights into the exit's own classifier,
so the model stays an encoder with exit heads (early exit, export-exits and export-hf read it
as any other).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from aclpipe.errors import UserError
from aclpipe.modeling.batching import collate
from aclpipe.modeling.model import MultiExitModel


@dataclass(frozen=True)
class LogisticRefit:
    """L2-regularised logistic regression (scikit-learn's lbfgs), one per exit."""

    C: float  # inverse regularisation strength, scikit-learn's (SetFit's head: its default, 1)
    max_iter: int  # lbfgs iterations at most


@torch.no_grad()
def exit_features(
    model: MultiExitModel, rows: list[dict], pad_id: int, batch_size: int, device
) -> np.ndarray:
    """Pooled features of every exit for every row, ``[E, N, D]``, in eval mode."""
    was_training = model.training
    model.eval()
    try:
        chunks = []
        for start in range(0, len(rows), batch_size):
            batch = collate(rows[start : start + batch_size], pad_id, regression=False)
            batch.pop("labels")
            batch = {k: v.to(device) for k, v in batch.items()}
            chunks.append(model(**batch).features.float().cpu().numpy())  # [E, b, D]
        return np.concatenate(chunks, axis=1)  # [E, N, D]
    finally:
        model.train(was_training)


def fit_logistic(
    features: np.ndarray, labels: np.ndarray, num_labels: int, refit: LogisticRefit
) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(W [C, D], b [C], converged)``: a classifier whose softmax is the fitted regression's
    probabilities. ``features [N, D]``, ``labels [N]`` in ``0..C-1``, every class present."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    if sorted(set(labels.tolist())) != list(range(num_labels)):
        raise UserError(
            f"the head refit needs an example of each of the {num_labels} classes among the "
            "training examples: draw or prepare more examples"
        )
    head = LogisticRegression(C=refit.C, max_iter=refit.max_iter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        head.fit(features.astype(np.float64), labels)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    weight, bias = head.coef_, head.intercept_  # [1, D], [1] (binary) or [C, D], [C]
    if num_labels == 2:  # sigmoid(w.z + b) = softmax([-(w.z + b) / 2, (w.z + b) / 2])[1]
        weight = np.concatenate([-weight / 2, weight / 2])  # [2, D]
        bias = np.concatenate([-bias / 2, bias / 2])  # [2]
    return weight, bias, converged


def refit_heads(
    model: MultiExitModel,
    refit: LogisticRefit,
    rows: list[dict],
    pad_id: int,
    batch_size: int,
    device,
) -> list[bool]:
    """Refit every exit's classifier on ``rows`` (a GLUE task's prepared training rows); the
    encoder and poolers are untouched. Returns whether each exit's fit converged."""
    if model.spec.num_labels < 2:
        raise UserError(
            "the logistic-regression head needs class labels; STS-B is regression: "
            "use ce, joint, deebert, deebert-sd or romebert for stsb"
        )
    features = exit_features(model, rows, pad_id, batch_size, device)  # [E, N, D]
    labels = np.asarray([row["label"] for row in rows])  # [N]
    converged = []
    for head, exit_features_ in zip(model.heads, features):
        weight, bias, ok = fit_logistic(exit_features_, labels, model.spec.num_labels, refit)
        classifier = head.classifier
        assert isinstance(classifier, torch.nn.Linear)  # every exit head ends in one
        with torch.no_grad():
            classifier.weight.copy_(torch.as_tensor(weight, dtype=classifier.weight.dtype))
            classifier.bias.copy_(torch.as_tensor(bias, dtype=classifier.bias.dtype))
        converged.append(ok)
    return converged
