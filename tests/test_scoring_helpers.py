"""The two helpers PyTorch scoring, the sweeps and the int8 export share: ``by_length``
(batches of similar length, put back in order) and ``setting_outcome`` (the metrics and exit
layers of one policy setting), each against a plain loop written here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aclpipe.data.tasks import get_task
from aclpipe.early_exit.policies import default_grid
from aclpipe.evaluation.scoring import by_length, setting_outcome


def _rows(lengths: list[int]) -> list[dict]:
    return [{"input_ids": list(range(n)), "tag": i} for i, n in enumerate(lengths)]


@pytest.mark.parametrize("batch_size", [1, 2, 3, 7, 50])
def test_by_length_batches_by_length_and_keeps_row_order(batch_size: int) -> None:
    lengths = [5, 2, 9, 2, 7, 1, 5, 3]
    rows = _rows(lengths)
    seen: list[list[int]] = []

    def forward(batch: list[dict]) -> np.ndarray:
        seen.append([r["tag"] for r in batch])
        # two "exits", one "class": the row's tag and its length, to find it again
        values = [[[r["tag"]] for r in batch], [[len(r["input_ids"])] for r in batch]]
        return np.array(values, dtype=np.float32)  # [2, b, 1]

    out = by_length(rows, batch_size, forward)
    assert out.shape == (2, len(rows), 1)
    assert out[0, :, 0].tolist() == list(range(len(rows)))  # every row back in its place
    assert out[1, :, 0].tolist() == lengths
    assert all(len(b) <= batch_size for b in seen)
    flat = [tag for b in seen for tag in b]
    assert sorted(flat) == list(range(len(rows)))  # each row once
    assert [lengths[t] for t in flat] == sorted(lengths)  # shortest first, ties in row order
    assert flat == sorted(range(len(rows)), key=lambda i: lengths[i])


def _softmax(row: list[float]) -> list[float]:
    z = [math.exp(v - max(row)) for v in row]
    return [v / sum(z) for v in z]


def _plain_exit(policy: str, threshold: float, rows: list[list[float]], eps: float) -> int:
    """One sample's exit index by the definitions of docs/methods.md, written out."""
    last = len(rows) - 1
    for k in range(last):
        p = _softmax(rows[k])
        if policy == "entropy" and -sum(q * math.log(q) for q in p if q > 0) < threshold:
            return k
        if policy == "confidence" and max(p) >= threshold:
            return k
        if policy == "patience":
            run = 1
            for j in range(k, 0, -1):
                same = int(np.argmax(rows[j])) == int(np.argmax(rows[j - 1]))
                if not same:
                    break
                run += 1
            if run > threshold:
                return k
    return last


@pytest.mark.parametrize("policy", ["entropy", "confidence", "patience", "none"])
def test_setting_outcome_against_a_plain_loop(policy: str) -> None:
    rng = np.random.default_rng(0)
    task = get_task("mrpc")  # accuracy and F1: both metrics
    exits = [1, 2, 4, 6]
    logits = (rng.normal(size=(len(exits), 40, 2)) * 2).astype(np.float32)  # [E, N, C]
    labels = rng.integers(0, 2, size=40)
    grid = [None] if policy == "none" else default_grid(policy, 2, len(exits), 6)
    for threshold in grid:
        metrics, layers = setting_outcome(task, logits, labels, exits, policy, threshold, 0.1)
        chosen = [
            len(exits) - 1
            if policy == "none"
            else _plain_exit(policy, threshold, logits[:, i].tolist(), 0.1)
            for i in range(logits.shape[1])
        ]
        assert layers.tolist() == [exits[k] for k in chosen], (policy, threshold)
        predictions = [int(np.argmax(logits[k, i])) for i, k in enumerate(chosen)]
        correct = sum(p == y for p, y in zip(predictions, labels.tolist()))
        assert metrics["accuracy"] == pytest.approx(correct / len(labels))
        tp = sum(p == 1 and y == 1 for p, y in zip(predictions, labels.tolist()))
        positives, predicted = int(labels.sum()), sum(predictions)
        f1 = 2 * tp / (positives + predicted) if positives + predicted else 0.0
        assert metrics["f1"] == pytest.approx(f1)


def test_setting_outcome_regression_scores_the_single_output() -> None:
    task = get_task("stsb")
    exits = [2, 4, 6]
    # rows 0..2 at exits 2, 4, 6: row 0 settles (|1.05 - 1.0| < 0.06) at exit 4, the others not
    logits = np.array(
        [[[1.0], [2.0], [3.5]], [[1.05], [2.5], [3.0]], [[1.0], [2.45], [3.0]]], dtype=np.float32
    )  # [E, N, 1]
    labels = np.array([1.0, 2.0, 3.0])
    metrics, layers = setting_outcome(task, logits, labels, exits, "patience", 1, 0.06)
    assert layers.tolist() == [4, 6, 6]
    _, layers_tight = setting_outcome(task, logits, labels, exits, "patience", 1, 0.04)
    assert layers_tight.tolist() == [6, 6, 6]  # eps reaches the policy: 0.05 is not < 0.04
    predictions = np.array([1.05, 2.45, 3.0], dtype=np.float32).astype(np.float64)
    assert metrics["pearson"] == pytest.approx(np.corrcoef(predictions, labels)[0, 1])
    metrics, layers = setting_outcome(task, logits, labels, exits, "none", None, 0.1)
    assert layers.tolist() == [6, 6, 6]
    assert metrics["pearson"] == pytest.approx(np.corrcoef([1.0, 2.45, 3.0], labels)[0, 1])
