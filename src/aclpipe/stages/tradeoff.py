"""The trade-off report: how much faster each method runs within a score budget.

The reference is the full ``ce`` model's dev score. For a budget of ``b`` points (x100), a
method's admissible settings are those of its early-exit sweep (``curves.json``), and its full
model, that score at least ``reference - b / 100``; we report the one with the best layer
speed-up, with that same setting's measured speed-ups at batch 1 and 32, per engine
(``aclpipe.exits.sweep``): PyTorch early exit over the PyTorch full model, ONNX Runtime's
over its own full model, and ONNX Runtime's over the PyTorch full model; "-" where a
curves.json holds no such timing (older ones, or ``evaluate.engines: [torch]``). Also the score
of every exit (the papers' layer-score curves). Writes, under ``reports/<task>/``, the ``NAMES``.

Beside every table: the majority-class score (``metrics.json``'s ``majority_score``,
docs/methods.md, "How a claim is judged"); a method whose full model is at or below it and a
budget whose floor is at or below it are marked, a measured speed-up above its layer bound is
marked ``*``, and too few timed examples are said, each also as a one-line warning (tables
and warnings: ``tradeoff_tables``; the rules: ``aclpipe.evaluation.caveats``)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from rich.console import Console

from aclpipe import atomic
from aclpipe.early_exit.budget import BUDGETS, admits, budget_floor, cheapest_within
from aclpipe.errors import UserError
from aclpipe.evaluation import caveats
from aclpipe.layout import (
    CURVES_JSON,
    EXIT_SCORES_CSV,
    EXIT_SCORES_PNG,
    METRICS,
    REPORTS,
    TRADEOFF_CSV,
    TRADEOFF_CURVES_CSV,
    TRADEOFF_MD,
    TRADEOFF_PNG,
)
from aclpipe.stages.tradeoff_plots import draw_exit_scores, draw_score_vs_time
from aclpipe.stages.tradeoff_tables import (
    budget_lines,
    markdown,
    method_names,
    render_budget_table,
    render_exit_table,
    warnings,
)

POINT_FIELDS = [
    "policy", "threshold", "score", "mean_exit_layer", "expected_time_ratio",
    "layer_speedup", "measured_speedup_batch1", "measured_speedup_batch32",
    "onnx_speedup_batch1", "onnx_speedup_batch32",
    "onnx_vs_torch_full_batch1", "onnx_vs_torch_full_batch32",
]  # fmt: skip
ROW_FIELDS = ["method", "budget_points", "chosen_on", "min_score", "validation_score",
              "met_on_dev", *POINT_FIELDS]  # fmt: skip
CURVE_FIELDS = ["method", *POINT_FIELDS]
PLOTS = (TRADEOFF_PNG, EXIT_SCORES_PNG)
NAMES = (TRADEOFF_MD, TRADEOFF_CSV, TRADEOFF_CURVES_CSV, EXIT_SCORES_CSV, *PLOTS)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(
            f"cannot read {path} ({err}): delete it and run the stage that writes it again"
        ) from err


def _how_to(task: str, method: str) -> str:
    run = f"--task {task} --method {method}"
    return f"run `aclpipe finetune {run}` and `aclpipe evaluate {run}` (or `dvc repro`)"


def load_results(task: str, task_dir: Path, methods: list[str] | None) -> tuple[dict, list[str]]:
    """``{method: {"metrics": ..., "curves": ... or None}}`` and the requested methods missing.

    Raises UserError when the task has no results at all or when ``ce`` (the reference) has none.
    """
    found = sorted(p.parent.name for p in task_dir.glob(f"*/{METRICS}"))
    if not found:
        raise UserError(
            f"no results for task {task} under {task_dir}: run `aclpipe prepare --task {task}`, "
            f"`aclpipe finetune --task {task}` and `aclpipe evaluate --task {task}`, or add "
            f"{task} to pipeline.tasks in params.yaml and run `dvc repro`"
        )
    if "ce" not in found:
        raise UserError(
            f"no ce result for {task}: the budgets are measured from the full ce model's dev "
            f"score, so {_how_to(task, 'ce')}"
        )
    wanted = methods if methods is not None else ["ce", *(m for m in found if m != "ce")]
    missing = [m for m in wanted if m not in found]
    results = {}
    for method in (m for m in wanted if m in found):
        curves_path = task_dir / method / CURVES_JSON
        results[method] = {
            "metrics": _read_json(task_dir / method / METRICS),
            "curves": _read_json(curves_path) if curves_path.exists() else None,
        }
    if not results:
        raise UserError(
            f"none of the requested methods ({', '.join(wanted)}) has results on {task}; "
            f"methods with results: {', '.join(found)}"
        )
    return results, missing


def full_model_point(result: dict) -> dict:
    """The method's full model as a setting: every sample leaves at the last exit. Its speed-up
    over itself is 1 on each engine timed; on ONNX Runtime, over the full PyTorch model, it is
    what the sweep measured (``full_model.onnx_vs_torch_full_batch{b}``), else unknown."""
    metrics, curves = result["metrics"], result["curves"]
    full = (curves or {}).get("full_model", {})
    ratio = full.get("expected_time_ratio", 1.0)
    onnx = {f"onnx_speedup_batch{b}": 1.0 if f"onnx_seconds_batch{b}" in full else None
            for b in (1, 32)}  # fmt: skip
    deployed = {f"onnx_vs_torch_full_batch{b}": full.get(f"onnx_vs_torch_full_batch{b}")
                for b in (1, 32)}  # fmt: skip
    return {"policy": "full", "threshold": None, "score": full.get("score", metrics["final_score"]),
            "mean_exit_layer": metrics["exits"][-1], "expected_time_ratio": ratio,
            "layer_speedup": 1.0 / ratio, "measured_speedup_batch1": 1.0,
            "measured_speedup_batch32": 1.0, **onnx, **deployed,
            "speedup_bound": None}  # fmt: skip


def method_points(result: dict) -> list[dict]:
    """The full model first, then every sweep point (fields of ``POINT_FIELDS``, and the
    ``speedup_bound`` its measured speed-ups are judged against)."""
    sweep = (result["curves"] or {}).get("points", [])
    return [
        full_model_point(result),
        *({**{f: p.get(f) for f in POINT_FIELDS}, "speedup_bound": caveats.speedup_bound(p)}
          for p in sweep),
    ]  # fmt: skip


def best_within(points: list[dict], reference: float, budget: float) -> int | None:
    """The index of the point a budget of ``budget`` points below ``reference`` picks: the best
    layer speed-up within it (ties: higher score, then first), by the one budget rule."""
    speed = [-p["layer_speedup"] for p in points]  # ordered as the cost: fastest first
    return cheapest_within([p["score"] for p in points], speed, reference, budget)


def exit_score_table(result: dict) -> dict[int, float]:
    """Score per exit layer on the primary dev split (the first in ``metrics.json``)."""
    primary = next(iter(result["metrics"]["splits"].values()))
    return {e["layer"]: e["score"] for e in primary["per_exit"]}


def tradeoff(
    task: str,
    reports_dir: Path = Path(REPORTS),
    methods: list[str] | None = None,
    budgets: tuple[int, ...] = BUDGETS,
    console: Console | None = None,
    full: bool = False,
) -> dict:
    """Speed-up within each score budget, per method; print the tables and write the report.

    Args:
        task: the GLUE task name (``rte``).
        reports_dir: the folder holding ``<task>/<method>/metrics.json`` (and ``curves.json``).
        methods: the methods to compare; ``None`` takes every method with results.
        budgets: score drops from the ce reference, in points (x100).
        console: where to print; a fresh ``Console()`` by default.
        full: print both tables whole (every engine at batch 1 and 32, the per-exit scores,
            the notes); by default one line per method and budget (``budget_lines``), which
            fits an 80-column terminal, and where the rest is.

    Returns:
        ``{"task", "reference", "budgets", "rows", "exit_scores", "num_layers", "missing",
        "files"}``; ``rows`` holds one dict per method and budget (fields ``ROW_FIELDS``, the
        point's fields ``None`` when no setting meets the budget).
    """
    console = console or Console()
    task_dir = reports_dir / task
    results, missing = load_results(task, task_dir, methods)
    notes = [f"no results for method {m} on {task}: {_how_to(task, m)}" for m in missing]
    notes += [f"{m} on {task} has no curves.json (early-exit sweep not run): only its full "
              "model counts" for m, r in results.items() if not r["curves"] and len(r["metrics"]["exits"]) > 1]  # fmt: skip
    for note in notes:
        console.print(note, highlight=False, soft_wrap=True)
    report, points, summary = _summarise(task, task_dir, results, missing, budgets)
    _print_tables(console, report, summary, full)
    _write_files(task, task_dir, report, summary, points)
    report["files"] = [str(task_dir / n) for n in NAMES]
    console.print(f"wrote {', '.join(NAMES)} in {task_dir}", highlight=False, soft_wrap=True)
    if not full:
        console.print(f"every engine at batch 1 and 32, scores per exit: {task_dir / 'tradeoff.md'}"
                      " (or --full)", highlight=False, soft_wrap=True)  # fmt: skip
    return report


def _summarise(
    task: str, task_dir: Path, results: dict, missing: list[str], budgets: tuple[int, ...]
) -> tuple[dict, dict[str, list[dict]], dict[str, dict]]:
    """The report (budget rows, exit scores, names, warnings), each method's points and its
    metrics."""
    ce_metrics = _read_json(task_dir / "ce" / METRICS)
    reference, majority = ce_metrics["final_score"], ce_metrics.get("majority_score")
    points = {m: method_points(r) for m, r in results.items()}
    # choose on validation when every method has a validation sweep (or a lone score)
    chosen_on = {m: validation_points(r) for m, r in results.items()}
    validation_reference = ce_metrics.get("splits", {}).get("validation", {}).get("final_score")
    aligned = all(v is not None and len(v) == len(points[m]) for m, v in chosen_on.items())
    validation = chosen_on if aligned and validation_reference is not None else None
    validation_reference = validation_reference if validation else None
    exit_scores = {m: exit_score_table(r) for m, r in results.items()}
    curves = [r["curves"] for r in results.values() if r["curves"]]
    report = {
        "task": task, "reference": reference, "budgets": list(budgets),
        "rows": budget_rows(points, reference, budgets, validation, validation_reference),
        "exit_scores": exit_scores, "validation_reference": validation_reference,
        "num_layers": max([c["num_layers"] for c in curves] + [max(s) for s in exit_scores.values()]),
        "missing": missing, "majority": majority,
        "timing": {m: r["curves"].get("timing_examples") for m, r in results.items() if r["curves"]},
    }  # fmt: skip
    summary = {m: r["metrics"] for m, r in results.items()}
    report["names"] = method_names(report, summary)  # with the majority mark
    report["warnings"] = warnings(report, summary)
    return report, points, summary


def _print_tables(console: Console, report: dict, summary: dict[str, dict], full: bool) -> None:
    if full:
        console.print(render_budget_table(report))
        console.print(render_exit_table(report, summary))
    else:
        for line in budget_lines(report):
            console.print(line, highlight=False, soft_wrap=True, markup=False)
    for line in report["warnings"]:
        console.print(line, highlight=False, soft_wrap=True, markup=False)


def _write_files(
    task: str, task_dir: Path, report: dict, summary: dict[str, dict], points: dict
) -> None:
    """tradeoff.md and the CSVs and plots, as one set (the table last)."""
    exit_scores, reference, majority = report["exit_scores"], report["reference"], report["majority"]
    timing = next((n for n in report["timing"].values() if n), None)
    texts = {
        TRADEOFF_MD: markdown(report, summary, timing),
        TRADEOFF_CSV: to_csv(ROW_FIELDS, report["rows"]),
        TRADEOFF_CURVES_CSV: to_csv(
            CURVE_FIELDS, [{"method": m, **p} for m, pts in points.items() for p in pts]
        ),
        EXIT_SCORES_CSV: to_csv(["method", "layer", "score"], [
            {"method": m, "layer": k, "score": s} for m, sc in exit_scores.items() for k, s in sc.items()
        ]),
    }  # fmt: skip
    with atomic.atomic_files(task_dir, last=TRADEOFF_MD) as tmp:  # one set, the table last
        for name, text in texts.items():
            (tmp / name).write_text(text, encoding="utf-8")
        draw_score_vs_time(task, points, reference, tmp / PLOTS[0], majority)
        draw_exit_scores(task, exit_scores, report["num_layers"], reference, tmp / PLOTS[1],
                         majority)  # fmt: skip


def validation_points(result: dict) -> list[dict] | None:
    """The full model, then every setting, scored on the validation split, in the order of
    ``method_points`` (None when evaluate had no validation split to sweep)."""
    curves = result["curves"] or {}
    swept = curves.get("validation")
    if not swept:
        validation = result["metrics"].get("splits", {}).get("validation")
        single = len(result["metrics"]["exits"]) == 1 or not curves.get("points")
        if validation is None or not single:
            return None
        swept = {"full_model": {"score": validation["final_score"]}, "points": []}
    full = {"score": swept["full_model"]["score"], "layer_speedup": 1.0}
    return [full, *swept["points"]]


def budget_rows(
    points: dict[str, list[dict]],
    reference: float,
    budgets: tuple[int, ...],
    validation: dict[str, list[dict]] | None = None,
    validation_reference: float | None = None,
) -> list[dict]:
    """One row per method and budget: the chosen point's fields, all ``None`` if none meets it.

    With ``validation`` (per method, the points of ``validation_points``) and ce's validation
    score, a setting is chosen on validation (the budget's floor is ce's validation score
    minus b) and the row gives its dev figures, with ``validation_score`` beside: dev only
    scores the choice (docs/methods.md, "How a claim is judged"), and ``met_on_dev`` says whether that dev
    score is still within b points of ce's dev score (a budget met on validation can be missed
    on dev; None when nothing was chosen). Without, the choice is made on dev."""
    rows = []
    for method, own in points.items():
        chooser = (validation or {}).get(method)
        on_validation = chooser is not None and validation_reference is not None
        for budget in budgets:
            floor = validation_reference if on_validation else reference
            min_score = budget_floor(floor, budget)  # 0.79, not 0.7900000000000001
            row = {"method": method, "budget_points": budget, "min_score": min_score,
                   "chosen_on": "validation" if on_validation else "dev"}  # fmt: skip
            if on_validation:
                index = best_within(chooser, floor, budget)
                best = own[index] if index is not None else dict.fromkeys(POINT_FIELDS)
                row["validation_score"] = chooser[index]["score"] if index is not None else None
                met = admits(best["score"], reference, budget)
                row["met_on_dev"] = None if index is None else met
            else:
                index = best_within(own, floor, budget)
                best = own[index] if index is not None else dict.fromkeys(POINT_FIELDS)
            rows.append({**row, **{f: best[f] for f in POINT_FIELDS},
                         "speedup_bound": best.get("speedup_bound")})  # fmt: skip
    return rows


def to_csv(fields: list[str], rows: list[dict]) -> str:
    """CSV text with a header; ``None`` becomes an empty cell."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in fields})
    return buffer.getvalue()
