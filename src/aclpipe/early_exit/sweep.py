"""Policy sweeps: quality from all-exit logits, speed from the early-exit runtime.

For each policy and threshold, the score, mean exit layer, expected time ratio and layer
speed-up come from the policy applied to the dev split's all-exit logits (no forward pass).
The measured speed-up is the full model's wall-clock time over the early-exit runtime's on the
same inputs (a fixed subset of the dev split), at batch size 1 and batched, each the median of
several repeats after a warm-up, both timed in this process, interleaved. Beside it, each
point keeps the layer speed-up of the timed examples alone (``timed_layer_speedup``): the
most that skipping layers can buy on exactly those inputs, against which a measured speed-up
is judged (``aclpipe.evaluation.caveats``).
"""

from __future__ import annotations

import functools
import statistics
import time

import numpy as np
import torch

from aclpipe.data.tasks import Task
from aclpipe.early_exit.policies import POLICIES, default_grid, exit_indices
from aclpipe.early_exit.runtime import EarlyExitRuntime, full_forward
from aclpipe.evaluation.metrics import compute_metrics, task_score
from aclpipe.modeling.batching import collate
from aclpipe.modeling.model import MultiExitModel


def policy_point(
    task: Task,
    logits: np.ndarray,
    labels: np.ndarray,
    exits: list[int],
    num_layers: int,
    policy: str,
    threshold: float,
    eps: float,
) -> dict:
    """Quality and expected cost of one setting, from all-exit logits ``[E, N, C]``."""
    chosen = exit_indices(policy, threshold, logits, task.is_regression, eps)  # [N]
    picked = logits[chosen, np.arange(logits.shape[1])]  # [N, C]
    predictions = picked[:, 0] if task.is_regression else picked.argmax(axis=-1)
    metrics = compute_metrics(task, predictions, labels)
    layers = np.asarray(exits)[chosen]
    ratio = float(layers.sum() / (len(layers) * num_layers))
    return {
        "policy": policy,
        "threshold": threshold,
        "score": task_score(task, metrics),
        "metrics": metrics,
        "mean_exit_layer": float(layers.mean()),
        "expected_time_ratio": ratio,
        "layer_speedup": 1.0 / ratio,
    }


def settings_grid(task: Task, num_exits: int, grid_points: int) -> list[tuple[str, float]]:
    """Every (policy, threshold) a sweep visits: each policy over its default grid."""
    policies = ["patience"] if task.is_regression else list(POLICIES)
    return [
        (p, t) for p in policies for t in default_grid(p, task.num_labels, num_exits, grid_points)
    ]


def quality_sweep(
    task: Task,
    logits: np.ndarray,
    labels: np.ndarray,
    exits: list[int],
    num_layers: int,
    grid_points: int,
    eps: float,
) -> dict:
    """Scores and expected costs of every setting on one split's all-exit logits (no
    timing): ``{"full_model": {"score"}, "points": [...]}``."""
    points = [
        policy_point(task, logits, labels, exits, num_layers, p, t, eps)
        for p, t in settings_grid(task, len(exits), grid_points)
    ]
    final = logits[-1][:, 0] if task.is_regression else logits[-1].argmax(-1)
    return {
        "full_model": {"score": task_score(task, compute_metrics(task, final, labels))},
        "points": points,
    }


def _batches(rows: list[dict], size: int, pad_id: int, regression: bool) -> list[dict]:
    out = []
    for start in range(0, len(rows), size):
        batch = collate(rows[start : start + size], pad_id, regression)
        batch.pop("labels")
        out.append(batch)
    return out


def _run_all(call, batches: list[dict]) -> None:
    for batch in batches:
        call(**batch)


def time_settings(
    model: MultiExitModel,
    rows: list[dict],
    settings: list[tuple[str, float]],
    pad_id: int,
    regression: bool,
    eps: float,
    repeats: int,
    batch_sizes: tuple[int, ...] = (1, 32),
) -> dict:
    """Seconds of the full model and of each setting's runtime, per batch size (medians).

    Each repeat times the full model and then every setting back to back, so machine noise
    falls on all of them alike; one untimed warm-up pass precedes the repeats.
    """
    model.eval()
    result = {}
    with torch.inference_mode():
        for size in batch_sizes:
            batches = _batches(rows, size, pad_id, regression)
            full = functools.partial(full_forward, model)
            calls = [full] + [EarlyExitRuntime(model, p, t, regression, eps) for p, t in settings]
            for call in calls:  # warm-up
                _run_all(call, batches)
            samples: list[list[float]] = [[] for _ in calls]
            for _ in range(repeats):
                for i, call in enumerate(calls):
                    started = time.perf_counter()
                    _run_all(call, batches)
                    samples[i].append(time.perf_counter() - started)
            medians = [statistics.median(s) for s in samples]
            result[size] = {"full": medians[0], "settings": medians[1:]}
    return result


def sweep(
    task: Task,
    model: MultiExitModel,
    logits: np.ndarray,
    labels: np.ndarray,
    timing_rows: list[dict],
    pad_id: int,
    grid_points: int,
    repeats: int,
    eps: float,
    timing_index: list[int] | None = None,
) -> dict:
    """Every policy over its threshold grid: quality, expected and measured speed-ups.

    ``timing_index``: the positions of ``timing_rows`` in the split (``logits``' second
    axis); when given, each timed point also gets ``timed_layer_speedup``.
    """
    exits, num_layers = model.spec.exits, model.num_layers
    settings = settings_grid(task, len(exits), grid_points)
    quality = quality_sweep(task, logits, labels, exits, num_layers, grid_points, eps)
    points, full_score = quality["points"], quality["full_model"]["score"]
    timing = (
        time_settings(model, timing_rows, settings, pad_id, task.is_regression, eps, repeats)
        if timing_rows
        else {}
    )
    for i, point in enumerate(points):
        for size, measured in timing.items():
            point[f"measured_speedup_batch{size}"] = measured["full"] / measured["settings"][i]
        if timing and timing_index is not None:
            policy, threshold = settings[i]
            timed_logits = logits[:, timing_index]  # [E, n, C]: per-sample choices, as for all
            chosen = exit_indices(policy, threshold, timed_logits, task.is_regression, eps)
            layers = np.asarray(exits)[chosen]  # [n]
            point["timed_layer_speedup"] = float(len(layers) * num_layers / layers.sum())
    return {
        "exits": exits,
        "num_layers": num_layers,
        "timing_examples": len(timing_rows),
        "timing_repeats": repeats,
        "timing_batch_sizes": list(timing),
        "full_model": {
            "score": full_score,
            "expected_time_ratio": exits[-1] / num_layers,
            **{f"seconds_batch{s}": m["full"] for s, m in timing.items()},
        },
        "points": points,
    }
