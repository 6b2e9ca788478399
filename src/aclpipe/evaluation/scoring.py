"""All-exit forward passes over a split, per-exit GLUE scores, the score of an exit setting,
and the majority-class floor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from aclpipe.data.prepared import load_meta, load_split
from aclpipe.data.tasks import Task
from aclpipe.early_exit.policies import exit_indices
from aclpipe.evaluation.metrics import compute_metrics, logits_to_predictions, task_score
from aclpipe.modeling.batching import collate
from aclpipe.modeling.model import MultiExitModel


def by_length(
    rows: list[dict], batch_size: int, forward: Callable[[list[dict]], np.ndarray]
) -> np.ndarray:
    """``forward`` over batches of rows of similar length (less padding), put back in the
    rows' order: ``forward(batch)`` gives ``[E, b, C]``, the result is ``[E, N, C]``.

    PyTorch's model (``all_exit_logits``) and the ONNX chain (``quantize.chain_logits``) are
    scored over the same batches. ``rows`` must not be empty.
    """
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    chunks = [
        forward([rows[i] for i in order[start : start + batch_size]])  # [E, b, C]
        for start in range(0, len(order), batch_size)
    ]
    in_length_order = np.concatenate(chunks, axis=1)  # [E, N, C]
    logits = np.empty_like(in_length_order)
    logits[:, np.array(order)] = in_length_order
    return logits


@torch.no_grad()
def all_exit_logits(
    model: MultiExitModel,
    rows: list[dict],
    batch_size: int,
    pad_id: int,
    regression: bool,
    device: torch.device | str = "cpu",
) -> np.ndarray:
    """Logits of every exit for every row, ``[E, N, C]``, in the rows' order (``by_length``)."""
    if not rows:
        return np.zeros((model.num_exits, 0, model.spec.num_labels), dtype=np.float32)

    def forward(batch_rows: list[dict]) -> np.ndarray:
        batch = collate(batch_rows, pad_id, regression)
        batch.pop("labels")
        batch = {k: v.to(device) for k, v in batch.items()}
        return model(**batch).logits.float().cpu().numpy()  # [E, b, C]

    was_training = model.training
    model.eval()
    try:
        return by_length(rows, batch_size, forward)
    finally:
        model.train(was_training)


def exit_scores(task: Task, logits: np.ndarray, labels: np.ndarray) -> list[dict]:
    """Metrics and score of each exit: a list of ``{"metrics": {...}, "score": s}``."""
    results = []
    for exit_logits in logits:  # [N, C]
        metrics = compute_metrics(task, logits_to_predictions(task, exit_logits), labels)
        results.append({"metrics": metrics, "score": task_score(task, metrics)})
    return results


def setting_outcome(
    task: Task,
    logits: np.ndarray,
    labels: np.ndarray,
    exits: list[int],
    policy: str,
    threshold: float | None,
    eps: float,
) -> tuple[dict, np.ndarray]:
    """Metrics of early exit at ``policy``/``threshold`` from all-exit logits ``[E, N, C]``,
    and each row's exit layer ``[N]``; policy ``none`` sends every row to the last exit."""
    rows = np.arange(logits.shape[1])
    chosen = exit_indices(policy, threshold, logits, task.is_regression, eps)  # [N]
    predictions = logits_to_predictions(task, logits[chosen, rows])  # [N]
    return compute_metrics(task, predictions, labels), np.asarray(exits)[chosen]


def split_labels(rows: list[dict], task: Task) -> np.ndarray:
    return np.array(
        [r["label"] for r in rows], dtype=np.float64 if task.is_regression else np.int64
    )


def majority_prediction(task: Task, data_dir: Path) -> int | float:
    """The constant prediction of the majority-class floor: the most frequent train label.

    Read from the train label counts that ``aclpipe prepare`` records in ``meta.json`` (of
    the train examples kept, after ``data.max_train_samples``); a tie goes to the lower
    label index. For STS-B (regression) it is the train mean. When ``meta.json`` lacks the
    counts, the labels of ``train.jsonl`` are counted instead.
    """
    counts = load_meta(data_dir).get("splits", {}).get("train", {}).get("labels")
    if task.is_regression:
        if counts and "mean" in counts:
            return float(counts["mean"])
        return float(np.mean([r["label"] for r in load_split(data_dir, "train")]))
    if counts and all(name in counts for name in task.labels):
        per_class = [counts[name] for name in task.labels]
    else:
        labels = [int(r["label"]) for r in load_split(data_dir, "train")]
        per_class = np.bincount(labels, minlength=task.num_labels).tolist()
    return int(np.argmax(per_class))  # argmax: the first of tied counts


def majority_scores(task: Task, prediction: int | float, labels: np.ndarray) -> dict:
    """Metrics and score of predicting ``prediction`` for every example: the floor.

    A constant makes MCC (CoLA) and the STS-B correlations undefined; they are scored 0, as
    for any collapsed exit (``metrics.py``), so the floor is 0 there; MRPC and QQP get the
    accuracy and F1 of the constant (F1 0 when the constant is the negative class).
    """
    constant = np.full(len(labels), prediction)  # [N]
    metrics = compute_metrics(task, constant, labels)
    return {"metrics": metrics, "score": task_score(task, metrics)}
