"""The evaluate stage: per-exit GLUE scores on the dev split(s), and what the gradient rule did."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from aclpipe import atomic
from aclpipe.data.prepared import load_split, subsample
from aclpipe.data.tasks import Task
from aclpipe.errors import UserError
from aclpipe.evaluation import caveats
from aclpipe.evaluation.config import EvaluateConfig
from aclpipe.evaluation.scoring import (
    all_exit_logits,
    exit_scores,
    majority_prediction,
    majority_scores,
    split_labels,
)
from aclpipe.exits.sweep import check_engines, quality_sweep, sweep
from aclpipe.layout import CURVES_CSV, CURVES_JSON, METRICS, PREDICTIONS, VALIDATION, split_file
from aclpipe.modeling.model import load_multi_exit
from aclpipe.run_log import has_run_log, read_run_log


def scored_splits(task: Task, data_dir: Path) -> list[str]:
    """The task's dev splits, then the validation split when ``prepare`` carved one."""
    dev = [name for name, _, _ in task.dev_splits]
    return dev + ([VALIDATION] if split_file(data_dir, VALIDATION).exists() else [])


def gradient_rule_summary(steps: list[dict]) -> list[dict]:
    """Per stage and epoch: steps, how many had two gradients, the share altered, mean cosine.

    ``steps`` are the training run's step records (``aclpipe.run_log``)."""
    summary: dict[tuple[int, int], dict] = {}
    for row in steps:
        entry = summary.setdefault(
            (row["stage"], row["epoch"]),
            {
                "stage": row["stage"],
                "epoch": row["epoch"],
                "steps": 0,
                "measured": 0,
                "altered": 0,
                "cosine_sum": 0.0,
            },
        )
        entry["steps"] += 1
        cosine = row.get("cosine")
        if cosine is not None and cosine == cosine:
            entry["measured"] += 1
            entry["cosine_sum"] += cosine
            entry["altered"] += bool(row.get("altered"))
    rows = []
    for entry in summary.values():
        measured = entry.pop("measured")
        cosine_sum = entry.pop("cosine_sum")
        entry["steps_with_two_gradients"] = measured
        entry["altered_rate"] = entry["altered"] / measured if measured else None
        entry["mean_cosine"] = cosine_sum / measured if measured else None
        rows.append(entry)
    return rows


def evaluate(
    task: Task,
    method: str,
    model_dir: Path,
    data_dir: Path,
    out_dir: Path,
    cfg: EvaluateConfig,
    device: str = "cpu",
    console: Console | None = None,
) -> dict:
    """Score every exit on each dev split and on the validation split if the data has one
    (``metrics.json``); keep every exit's logits per example (``predictions.npz``:
    ``exits``, ``num_layers``, ``<split>_logits`` ``[E, N, C]`` float32 and ``<split>_labels``
    ``[N]``); sweep the exit policies on the first dev split, timed (``curves.json``,
    ``curves.csv``), and on the validation split, untimed (``curves.json``'s ``validation``:
    where ``export-exits`` and the reports choose a setting, so that dev is only scored).

    Beside each split's scores, ``metrics.json`` holds the majority-class floor
    (``majority_score``, ``majority_metrics``: a constant prediction of the most frequent
    train label, ``scoring.majority_prediction``); a warning is printed when an exit scores
    at or below it, or when the speed-ups were timed on too few examples or exceed their bound
    (``aclpipe.evaluation.caveats``).
    """
    if task.embeds:  # no classifier to score: its embeddings are scored by sts-eval
        raise UserError(
            f"{task.name} is a sentence-embedding task: score it with `aclpipe sts-eval "
            f"--model-dir {model_dir}`"
        )
    console = console or Console()
    if cfg.sweep and cfg.timing_examples:
        check_engines(cfg.engines)  # before scoring: a missing onnxruntime says so at once
    model = load_multi_exit(model_dir).to(device)
    pad_id = model.encoder.config.pad_token_id or 0
    report = {"task": task.name, "method": method, "exits": model.spec.exits, "splits": {}}
    constant = majority_prediction(task, data_dir)
    predictions, primary_rows, primary_logits = _score_splits(
        task, model, data_dir, cfg.batch_size, pad_id, device, constant, report["splits"]
    )
    primary = report["splits"][task.dev_splits[0][0]]
    report["final_score"] = primary["final_score"]
    report["average_over_exits"] = primary["average_over_exits"]
    steps = read_run_log(model_dir).steps if has_run_log(model_dir) else []
    report["gradient_rule"] = gradient_rule_summary(steps)
    report["majority_score"] = primary["majority_score"]
    report["majority_prediction"] = (
        constant if task.is_regression else {"label": constant, "name": task.labels[constant]}
    )
    curves = _curves(task, method, model, cfg, pad_id, predictions, primary_rows, primary_logits,
                     report["final_score"])  # fmt: skip
    with atomic.atomic_files(out_dir, last=METRICS) as tmp:  # one set, metrics last
        (tmp / METRICS).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        (tmp / CURVES_JSON).write_text(json.dumps(curves, indent=2) + "\n", encoding="utf-8")
        (tmp / CURVES_CSV).write_text(curves_csv(curves["points"]), encoding="utf-8")
        np.savez_compressed(tmp / PREDICTIONS, **predictions)
    console.print(render_table(report))
    for line in score_warnings(report) + timing_warnings(curves):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    if curves["points"]:
        console.print(render_curves(curves))
    return report


def _score_splits(
    task: Task, model, data_dir: Path, batch_size: int, pad_id: int, device: str, constant,
    splits: dict,
) -> tuple[dict, list, np.ndarray]:  # fmt: skip
    """Score every exit on each scored split into ``splits`` (with the majority-class floor);
    returns the per-example outputs for ``predictions.npz`` and the first dev split's rows and
    logits ``[E, N, C]``."""
    exits = model.spec.exits
    predictions = {"exits": np.asarray(exits, dtype=np.int64), "num_layers": model.num_layers}
    for split in scored_splits(task, data_dir):
        rows = load_split(data_dir, split)
        logits = all_exit_logits(model, rows, batch_size, pad_id, task.is_regression, device)
        labels = split_labels(rows, task)
        predictions[f"{split}_logits"], predictions[f"{split}_labels"] = logits, labels
        per_exit = exit_scores(task, logits, labels)
        scores = [e["score"] for e in per_exit]
        majority = majority_scores(task, constant, labels)
        splits[split] = {
            "examples": len(rows),
            "per_exit": [{"layer": k, **e} for k, e in zip(exits, per_exit)],
            "final_score": scores[-1],
            "average_over_exits": sum(scores) / len(scores),
            "majority_score": majority["score"],
            "majority_metrics": majority["metrics"],
        }
        if split == task.dev_splits[0][0]:
            primary_rows, primary_logits = rows, logits
    return predictions, primary_rows, primary_logits


def _curves(
    task: Task, method: str, model, cfg: EvaluateConfig, pad_id: int, predictions: dict,
    primary_rows: list, primary_logits: np.ndarray, final_score: float,
) -> dict:  # fmt: skip
    """The exit policies swept on the first dev split, timed on the CPU, and on the validation
    split, untimed (a multi-exit model with ``cfg.sweep``); else the full model's score."""
    curves = {
        "task": task.name,
        "method": method,
        "split": task.dev_splits[0][0],
        "exits": model.spec.exits,
        "num_layers": model.num_layers,
        "points": [],
    }
    if not (cfg.sweep and model.num_exits > 1):
        curves["full_model"] = {"score": final_score}
        return curves
    # The same examples as subsample(primary_rows, ...), with their positions kept.
    timing_index = subsample(list(range(len(primary_rows))), cfg.timing_examples, seed=0)
    timing_rows = [primary_rows[i] for i in timing_index]
    model.to("cpu")  # speed is measured on the CPU, where early exit is shipped here
    curves.update(
        sweep(
            task,
            model,
            primary_logits,
            split_labels(primary_rows, task),
            timing_rows,
            pad_id,
            cfg.grid_points,
            cfg.timing_repeats,
            cfg.patience_eps,
            timing_index,
            cfg.engines,
        )
    )
    if f"{VALIDATION}_logits" in predictions:  # where exit settings are chosen
        curves[VALIDATION] = quality_sweep(
            task,
            predictions[f"{VALIDATION}_logits"],
            predictions[f"{VALIDATION}_labels"],
            model.spec.exits,
            model.num_layers,
            cfg.grid_points,
            cfg.patience_eps,
        )
    return curves


def score_warnings(report: dict) -> list[str]:
    """One line per split whose final exit, or else some exits, are at or below the floor."""
    lines = []
    for split, result in report["splits"].items():
        name = f"{report['task']}/{report['method']}"
        if len(report["splits"]) > 1:
            name += f" {split}"
        majority = result.get("majority_score")
        per_exit = result["per_exit"]
        if caveats.at_or_below(per_exit[-1]["score"], majority):
            lines.append(caveats.final_warning(name, per_exit[-1]["score"], majority))
            continue
        low = [e["layer"] for e in per_exit if caveats.at_or_below(e["score"], majority)]
        if low:
            lines.append(caveats.exits_warning(name, low, majority))
    return lines


def timing_warnings(curves: dict) -> list[str]:
    """Too few timed examples; measured speed-ups above their bound (one line each)."""
    examples = curves.get("timing_examples")
    name = f"{curves['task']}/{curves['method']}"
    lines = [caveats.few_timed_warning(name, examples)] if caveats.too_few_timed(examples) else []
    flagged = [
        (f"{p['policy']}@{p['threshold']:g}{label}", size, p[key], caveats.speedup_bound(p))
        for p in curves["points"]
        for prefix, label in caveats.BOUNDED_SPEEDUPS
        for size in (1, 32)
        if caveats.is_noise(p.get(key := f"{prefix}_batch{size}"), caveats.speedup_bound(p))
    ]
    if flagged:
        note = caveats.timing_note(examples, curves.get("timing_repeats"))
        lines.append(caveats.noise_warning(name, flagged, note))
    return lines


CURVE_COLUMNS = (
    "policy",
    "threshold",
    "score",
    "mean_exit_layer",
    "expected_time_ratio",
    "layer_speedup",
    "measured_speedup_batch1",
    "measured_speedup_batch32",
    "onnx_speedup_batch1",
    "onnx_speedup_batch32",
    "onnx_vs_torch_full_batch1",
    "onnx_vs_torch_full_batch32",
)


def curves_csv(points: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CURVE_COLUMNS)
    for point in points:
        writer.writerow([_cell(point.get(c)) for c in CURVE_COLUMNS])
    return buffer.getvalue()


def _cell(value) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def render_curves(curves: dict) -> Table:
    """The sweep; measured speed-ups above their bound are marked ``*`` (see the caption)."""
    table = Table(
        title=f"{curves['task']} / {curves['method']}: exit policies "
        f"(speed measured on {curves.get('timing_examples', 0)} dev examples)",
        caption=f"{caveats.ENGINES_NOTE}; speed-ups "
        f"{caveats.timing_note(curves.get('timing_examples'), curves.get('timing_repeats'))}; "
        f"{caveats.NOISE_FOOTNOTE}",
    )
    for column in (
        "policy",
        "threshold",
        "score",
        "mean layer",
        "layer speed-up",
        *(f"{engine} b{size}" for engine in ("torch", "onnx", "onnx/torch-full") for size in (1, 32)),
    ):  # fmt: skip
        table.add_column(column, justify="left" if column == "policy" else "right")
    for p in curves["points"]:
        bound = caveats.speedup_bound(p)
        table.add_row(
            p["policy"],
            f"{p['threshold']:g}",
            f"{100 * p['score']:.2f}",
            f"{p['mean_exit_layer']:.2f}",
            f"{p['layer_speedup']:.2f}x",
            *(_speed(p.get(f"{key}_batch{size}"), bound if bounded else None)
              for key, bounded in (("measured_speedup", True), ("onnx_speedup", True),
                                   ("onnx_vs_torch_full", False))
              for size in (1, 32)),
        )  # fmt: skip
    return table


def _speed(value, bound=None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" + (caveats.NOISE_MARK if caveats.is_noise(value, bound) else "")


def render_table(report: dict) -> Table:
    table = Table(
        title=f"{report['task']} / {report['method']}: dev score per exit (x100)",
        caption="majority: the score of predicting the most frequent train label for every "
        "example (STS-B: the train mean, whose correlations are 0)",
    )
    table.add_column("split")
    for k in report["exits"]:
        table.add_column(f"L{k}", justify="right")
    table.add_column("avg", justify="right")
    table.add_column("majority", justify="right")
    for split, result in report["splits"].items():
        cells = [f"{100 * e['score']:.2f}" for e in result["per_exit"]]
        majority = result.get("majority_score")
        table.add_row(
            split,
            *cells,
            f"{100 * result['average_over_exits']:.2f}",
            "-" if majority is None else f"{100 * majority:.2f}",
        )
    return table
