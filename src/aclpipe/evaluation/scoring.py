"""All-exit forward passes over a split, and per-exit GLUE scores."""

from __future__ import annotations

import numpy as np
import torch

from aclpipe.data.tasks import Task
from aclpipe.evaluation.metrics import compute_metrics, logits_to_predictions, task_score
from aclpipe.modeling.batching import collate
from aclpipe.modeling.model import MultiExitModel


@torch.no_grad()
def all_exit_logits(
    model: MultiExitModel,
    rows: list[dict],
    batch_size: int,
    pad_id: int,
    regression: bool,
    device: torch.device | str = "cpu",
) -> np.ndarray:
    """Logits of every exit for every row, ``[E, N, C]``, in the rows' order.

    Rows are batched by length (less padding), then put back in order.
    """
    was_training = model.training
    model.eval()
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    chunks = []
    for start in range(0, len(order), batch_size):
        batch = collate([rows[i] for i in order[start : start + batch_size]], pad_id, regression)
        batch.pop("labels")
        batch = {k: v.to(device) for k, v in batch.items()}
        chunks.append(model(**batch).logits.float().cpu())  # [E, b, C]
    model.train(was_training)
    if not chunks:
        return np.zeros((model.num_exits, 0, model.spec.num_labels), dtype=np.float32)
    sorted_logits = torch.cat(chunks, dim=1)  # [E, N, C] in length order
    logits = torch.empty_like(sorted_logits)
    logits[:, torch.tensor(order)] = sorted_logits
    return logits.numpy()


def exit_scores(task: Task, logits: np.ndarray, labels: np.ndarray) -> list[dict]:
    """Metrics and score of each exit: a list of ``{"metrics": {...}, "score": s}``."""
    results = []
    for exit_logits in logits:  # [N, C]
        metrics = compute_metrics(task, logits_to_predictions(task, exit_logits), labels)
        results.append({"metrics": metrics, "score": task_score(task, metrics)})
    return results


def split_labels(rows: list[dict], task: Task) -> np.ndarray:
    return np.array(
        [r["label"] for r in rows], dtype=np.float64 if task.is_regression else np.int64
    )
