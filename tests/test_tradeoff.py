"""The trade-off report on hand-made results: budget selection, errors, and every file written."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from paths import at
from rich.console import Console

import aclpipe.stages.tradeoff
from aclpipe.errors import UserError
from aclpipe.layout import (
    CURVES_JSON,
    EXIT_SCORES_CSV,
    EXIT_SCORES_PNG,
    METRICS,
    TRADEOFF_CSV,
    TRADEOFF_CURVES_CSV,
    TRADEOFF_MD,
    TRADEOFF_PNG,
)
from aclpipe.stages.tradeoff import best_within, tradeoff

TASK = "rte"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# joint's sweep on a 4-layer model; reference (ce) is 0.80. Hand-picked so that each budget
# picks a different setting: 0 -> entropy@0.3, 1 -> patience@1, 2 -> entropy@0.5,
# 5 -> confidence@0.8; confidence@0.6 is fastest but never within budget.
JOINT_POINTS = [
    # policy, threshold, score, expected_time_ratio, measured b1, measured b32 (PyTorch)
    ("entropy", 0.1, 0.805, 0.8, 1.10, 1.20),
    ("entropy", 0.3, 0.800, 0.625, 1.40, 1.50),
    ("entropy", 0.5, 0.785, 0.5, 1.70, 1.90),
    ("patience", 1, 0.790, 0.55, 1.55, 1.60),
    ("confidence", 0.8, 0.760, 0.4, 2.10, 2.30),
    ("confidence", 0.6, 0.700, 0.25, 3.00, 3.50),
]
# per point, ONNX Runtime: onnx_speedup b1, b32; onnx_vs_torch_full b1, b32
ONNX_POINTS = [
    (1.15, 1.22, 2.60, 2.10),
    (1.45, 1.55, 3.30, 2.70),
    (1.85, 1.95, 4.20, 3.40),
    (1.60, 1.70, 3.60, 3.00),
    (2.30, 2.40, 5.20, 4.10),
    (3.40, 3.80, 7.70, 6.40),
]
ONNX_FIELDS = ["onnx_speedup_batch1", "onnx_speedup_batch32",
               "onnx_vs_torch_full_batch1", "onnx_vs_torch_full_batch32"]  # fmt: skip


def quiet() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, color_system=None), out


def write_metrics(folder: Path, method: str, scores: dict[int, float]) -> None:
    per_exit = [{"layer": k, "metrics": {"accuracy": s}, "score": s} for k, s in scores.items()]
    values = list(scores.values())
    split = {"examples": 200, "per_exit": per_exit, "final_score": values[-1],
             "average_over_exits": sum(values) / len(values)}  # fmt: skip
    report = {"task": TASK, "method": method, "exits": list(scores), "splits": {"dev": split},
              "final_score": values[-1], "average_over_exits": split["average_over_exits"]}  # fmt: skip
    (folder / method).mkdir(parents=True, exist_ok=True)
    (folder / method / METRICS).write_text(json.dumps(report), encoding="utf-8")


def write_curves(folder: Path, method: str, full_score: float, onnx: bool = True) -> None:
    """``onnx=False``: a curves.json from before the onnx engine (PyTorch timings only)."""
    points = [
        {"policy": p, "threshold": t, "score": s, "metrics": {"accuracy": s},
         "mean_exit_layer": 4 * r, "expected_time_ratio": r, "layer_speedup": 1 / r,
         "measured_speedup_batch1": b1, "measured_speedup_batch32": b32,
         **(dict(zip(ONNX_FIELDS, engine)) if onnx else {})}
        for (p, t, s, r, b1, b32), engine in zip(JOINT_POINTS, ONNX_POINTS)
    ]  # fmt: skip
    full = {"score": full_score, "seconds_batch1": 2.0, "seconds_batch32": 0.5}
    if onnx:
        full.update(onnx_seconds_batch1=0.8, onnx_seconds_batch32=0.25,
                    onnx_vs_torch_full_batch1=2.5, onnx_vs_torch_full_batch32=2.0)  # fmt: skip
    curves = {"task": TASK, "method": method, "exits": [1, 2, 3, 4], "num_layers": 4,
              "split": "dev", "timing_examples": 64, "full_model": full, "points": points}  # fmt: skip
    (folder / method / CURVES_JSON).write_text(json.dumps(curves), encoding="utf-8")


@pytest.fixture
def reports(tmp_path: Path) -> Path:
    """reports/rte/{ce, joint, scl}: ce 0.80 (single exit), joint 4 exits + sweep, scl 0.79."""
    task_dir = at(tmp_path).reports(TASK)
    write_metrics(task_dir, "ce", {4: 0.80})
    write_metrics(task_dir, "joint", {1: 0.62, 2: 0.71, 3: 0.78, 4: 0.81})
    write_curves(task_dir, "joint", 0.81)
    write_metrics(task_dir, "scl", {4: 0.79})
    return at(tmp_path).reports()


@pytest.fixture
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip the figures (most of a run's time) where a test checks only the numbers."""
    monkeypatch.setattr(aclpipe.stages.tradeoff, "draw_score_vs_time", lambda *args: None)
    monkeypatch.setattr(aclpipe.stages.tradeoff, "draw_exit_scores", lambda *args: None)


def pick(result: dict, method: str, budget: int) -> dict:
    return next(r for r in result["rows"] if r["method"] == method and r["budget_points"] == budget)


def test_budget_selection_by_hand(reports: Path, no_plots: None) -> None:
    console, _ = quiet()
    result = tradeoff(TASK, reports, console=console)
    assert result["reference"] == pytest.approx(0.80)
    assert list(result["exit_scores"]) == ["ce", "joint", "scl"]
    expected = {0: ("entropy", 0.3, 1.6), 1: ("patience", 1, 1 / 0.55),
                2: ("entropy", 0.5, 2.0), 5: ("confidence", 0.8, 2.5)}  # fmt: skip
    for budget, (policy, threshold, speedup) in expected.items():
        row = pick(result, "joint", budget)
        assert (row["policy"], row["threshold"]) == (policy, threshold), budget
        assert row["layer_speedup"] == pytest.approx(speedup)
        assert row["min_score"] == pytest.approx(0.80 - budget / 100)
    # the measured speed-ups are those of the chosen point, not the best measured ones
    row = pick(result, "joint", 2)
    assert (row["measured_speedup_batch1"], row["measured_speedup_batch32"]) == (1.70, 1.90)
    assert [row[f] for f in ONNX_FIELDS] == [1.85, 1.95, 4.20, 3.40]  # each engine's, same point
    # ce's full model meets every budget at speed-up 1; ce was never timed on ONNX Runtime
    for budget in (0, 1, 2, 5):
        row = pick(result, "ce", budget)
        assert row["policy"] == "full" and row["layer_speedup"] == 1.0
        assert row["measured_speedup_batch1"] == row["measured_speedup_batch32"] == 1.0
        assert all(row[f] is None for f in ONNX_FIELDS)


def test_dash_when_no_point_meets_the_budget(reports: Path, no_plots: None) -> None:
    console, out = quiet()
    result = tradeoff(TASK, reports, console=console)
    below = pick(result, "scl", 0)  # 0.79 < 0.80
    assert all(below[f] is None for f in ("policy", "score", "layer_speedup"))
    assert pick(result, "scl", 1)["policy"] == "full"  # 0.79 >= 0.80 - 0.01
    scl_line = next(line for line in out.getvalue().splitlines() if line.startswith("scl "))
    assert scl_line.split()[1:5] == ["no", "drop", "-", "-"]  # budget, layer, score
    md = (reports / TASK / TRADEOFF_MD).read_text(encoding="utf-8")
    scl_md = next(line for line in md.splitlines() if line.startswith("| scl") and "×" in line)
    assert scl_md.split("|")[2].strip() == "-"


def test_budget_floor_is_inclusive() -> None:
    points = [{"policy": "entropy", "threshold": 0.2, "score": 0.78, "layer_speedup": 2.0}]
    assert best_within(points, 0.80, 2) == 0  # 0.78 is on the floor: admitted
    assert best_within(points, 0.80, 1) is None


def test_missing_method_is_named_once_and_the_rest_print(reports: Path, no_plots: None) -> None:
    console, out = quiet()
    result = tradeoff(TASK, reports, methods=["ce", "joint", "romebert"], console=console)
    assert result["missing"] == ["romebert"]
    lines = [line for line in out.getvalue().splitlines() if "romebert" in line]
    assert len(lines) == 1
    assert "aclpipe finetune --task rte --method romebert" in lines[0]
    assert "aclpipe evaluate" in lines[0]
    assert any(line.startswith("joint ") for line in out.getvalue().splitlines())
    assert {r["method"] for r in result["rows"]} == {"ce", "joint"}


def test_no_ce_result_is_a_user_error(reports: Path) -> None:
    (reports / TASK / "ce" / METRICS).unlink()
    with pytest.raises(UserError, match="full ce model") as err:
        tradeoff(TASK, reports, console=quiet()[0])
    assert "--method ce" in str(err.value)


def test_no_results_for_the_task_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no results for task rte") as err:
        tradeoff(TASK, at(tmp_path).reports(), console=quiet()[0])
    message = str(err.value)
    assert "aclpipe prepare --task rte" in message
    assert "pipeline.tasks" in message and "dvc repro" in message


def read_csv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_every_file_is_written_and_parses_back(reports: Path) -> None:
    result = tradeoff(TASK, reports, console=quiet()[0])
    task_dir = reports / TASK
    names = [TRADEOFF_MD, TRADEOFF_CSV, TRADEOFF_CURVES_CSV, EXIT_SCORES_CSV,
             TRADEOFF_PNG, EXIT_SCORES_PNG]  # fmt: skip
    assert sorted(Path(f).name for f in result["files"]) == sorted(names)
    assert not list(task_dir.glob(".tmp-*"))

    rows = read_csv(task_dir / TRADEOFF_CSV)
    assert len(rows) == 3 * 4
    assert list(rows[0])[-6:] == ["measured_speedup_batch1", "measured_speedup_batch32",
                                  *ONNX_FIELDS]  # fmt: skip
    joint2 = next(r for r in rows if r["method"] == "joint" and r["budget_points"] == "2")
    assert joint2["policy"] == "entropy" and float(joint2["threshold"]) == 0.5
    assert float(joint2["score"]) == pytest.approx(0.785)
    assert [float(joint2[f]) for f in ONNX_FIELDS] == [1.85, 1.95, 4.20, 3.40]
    assert all(r[f] == "" for r in rows if r["method"] == "ce" for f in ONNX_FIELDS)
    scl0 = next(r for r in rows if r["method"] == "scl" and r["budget_points"] == "0")
    assert scl0["policy"] == "" and scl0["layer_speedup"] == ""

    curves = read_csv(task_dir / TRADEOFF_CURVES_CSV)
    assert len(curves) == len(JOINT_POINTS) + 3  # every sweep point, plus each full model
    assert {r["method"] for r in curves if r["policy"] == "full"} == {"ce", "joint", "scl"}
    joint_full = next(r for r in curves if r["method"] == "joint" and r["policy"] == "full")
    assert [joint_full[f] for f in ONNX_FIELDS] == ["1.0", "1.0", "2.5", "2.0"]
    assert (
        float(next(r for r in curves if r["policy"] == "patience")["expected_time_ratio"]) == 0.55
    )

    exits = read_csv(task_dir / EXIT_SCORES_CSV)
    assert [(r["method"], int(r["layer"])) for r in exits] == [
        ("ce", 4), ("joint", 1), ("joint", 2), ("joint", 3), ("joint", 4), ("scl", 4)
    ]  # fmt: skip
    assert float(exits[1]["score"]) == pytest.approx(0.62)

    md = (task_dir / TRADEOFF_MD).read_text(encoding="utf-8")
    assert "80.00" in md and "measured speed-up" in md and "64 dev examples" in md
    assert ("2.00× (78.50); torch 1.70× / 1.90×; onnx 1.85× / 1.95×; "
            "onnx/torch-full 4.20× / 3.40×; entropy@0.5") in md  # fmt: skip
    assert "onnx/torch-full: the full PyTorch model's time" in md  # what each engine's ratio is
    assert "| joint | 62.00 | 71.00 | 78.00 | 81.00 |" in md
    assert "| ce |  |  |  | 80.00 |" in md  # blank where there is no exit
    for png in (TRADEOFF_PNG, EXIT_SCORES_PNG):
        assert (task_dir / png).read_bytes()[:8] == PNG_MAGIC


def test_multi_exit_method_without_curves_counts_its_full_model(
    reports: Path, no_plots: None
) -> None:
    (reports / TASK / "joint" / CURVES_JSON).unlink()
    console, out = quiet()
    result = tradeoff(TASK, reports, console=console)
    assert pick(result, "joint", 0)["policy"] == "full"
    assert "joint on rte has no curves.json" in out.getvalue()
    assert result["num_layers"] == 4


def test_curves_without_onnx_timings_still_render(reports: Path, no_plots: None) -> None:
    """A curves.json from before the onnx engine (or evaluate.engines: [torch]): "-"."""
    write_curves(reports / TASK, "joint", 0.81, onnx=False)
    console, out = quiet()
    result = tradeoff(TASK, reports, console=console, full=True)
    assert all(pick(result, "joint", b)[f] is None for b in (0, 1, 2, 5) for f in ONNX_FIELDS)
    md = (reports / TASK / TRADEOFF_MD).read_text(encoding="utf-8")
    assert ("2.00× (78.50); torch 1.70× / 1.90×; onnx - / -; onnx/torch-full - / -; "
            "entropy@0.5") in md  # fmt: skip
    assert "onnx - / -" in out.getvalue()
    rows = read_csv(reports / TASK / TRADEOFF_CSV)
    assert all(r[f] == "" for r in rows for f in ONNX_FIELDS)


def test_onnx_speedup_above_its_bound_is_marked(reports: Path, no_plots: None) -> None:
    """ONNX Runtime's early exit over its own full model has the layer bound (entropy@0.5:
    2.00x); over the full PyTorch model it has none."""
    path = reports / TASK / "joint" / CURVES_JSON
    curves = json.loads(path.read_text(encoding="utf-8"))
    curves["points"][2].update(onnx_speedup_batch1=2.2, onnx_vs_torch_full_batch1=9.0)
    path.write_text(json.dumps(curves), encoding="utf-8")
    result = tradeoff(TASK, reports, console=quiet()[0])
    md = (reports / TASK / TRADEOFF_MD).read_text(encoding="utf-8")
    assert "onnx 2.20×* / 1.95×; onnx/torch-full 9.00× / 3.40×" in md
    (line,) = [w for w in result["warnings"] if "timing noise" in w]
    assert "1 measured speed-up above" in line and "entropy@0.5 (onnx) at batch 1" in line


def add_validation(folder: Path, method: str, final: float, scores: list[float] | None) -> None:
    """A validation split in metrics.json, and (multi-exit) a validation sweep in curves.json
    with these scores at JOINT_POINTS' settings."""
    metrics = json.loads((folder / method / METRICS).read_text())
    metrics["splits"]["validation"] = {"final_score": final, "per_exit": []}
    (folder / method / METRICS).write_text(json.dumps(metrics))
    if scores is not None:
        curves = json.loads((folder / method / CURVES_JSON).read_text())
        curves["validation"] = {"full_model": {"score": final}, "points": [
            {"policy": p, "threshold": t, "score": s, "layer_speedup": 1 / r}
            for (p, t, _, r, _, _), s in zip(JOINT_POINTS, scores)]}  # fmt: skip
        (folder / method / CURVES_JSON).write_text(json.dumps(curves))


def test_settings_are_chosen_on_validation_and_scored_on_dev(
    reports: Path, no_plots: None
) -> None:
    """ce scores 0.85 on validation. joint's validation scores admit, within 1 point (0.84),
    only entropy@0.1 and confidence@0.6 (the fastest, 4x), though confidence@0.6 is 10
    points down on dev: the row gives its dev figures, and the choice stays."""
    task_dir = reports / TASK
    add_validation(task_dir, "ce", 0.85, None)
    add_validation(task_dir, "joint", 0.86, [0.845, 0.80, 0.80, 0.80, 0.80, 0.84])
    add_validation(task_dir, "scl", 0.84, None)
    console, _ = quiet()
    result = tradeoff(TASK, reports, console=console)
    assert result["validation_reference"] == 0.85
    row = pick(result, "joint", 1)
    assert (row["policy"], row["threshold"], row["chosen_on"]) == ("confidence", 0.6, "validation")
    assert row["score"] == 0.700 and row["validation_score"] == 0.84  # dev, and where chosen
    assert row["min_score"] == pytest.approx(0.84)
    assert row["met_on_dev"] is False  # 0.700 < ce's dev 0.80 - 0.01: said in the cell
    assert [pick(result, "joint", b)["met_on_dev"] for b in (0, 2, 5)] == [True, False, False]
    row = pick(result, "joint", 0)  # floor 0.85: the full model (0.86) is the fastest admitted
    assert (row["policy"], row["score"], row["validation_score"]) == ("full", 0.81, 0.86)
    assert pick(result, "scl", 0)["policy"] is None  # 0.84 < 0.85 on validation
    assert pick(result, "scl", 1)["policy"] == "full"
    assert pick(result, "scl", 0)["met_on_dev"] is None  # nothing chosen
    text = (task_dir / TRADEOFF_MD).read_text()
    assert "chosen on the validation split" in text
    assert "4.00× (70.00, under the budget on dev)" in text
    assert "(under the budget on dev) after a score" in text
    assert "(81.00, under" not in text  # the full model at b 0 keeps its budget on dev
    csv_rows = [r for r in read_csv(task_dir / TRADEOFF_CSV) if r["method"] == "joint"]
    assert [r["met_on_dev"] for r in csv_rows] == ["True", "False", "False", "False"]
    # a method without a validation sweep: every method is chosen on dev, as before
    curves = json.loads((task_dir / "joint" / CURVES_JSON).read_text())
    del curves["validation"]
    (task_dir / "joint" / CURVES_JSON).write_text(json.dumps(curves))
    result = tradeoff(TASK, reports, console=quiet()[0])
    assert result["validation_reference"] is None
    assert pick(result, "joint", 1)["chosen_on"] == "dev"
    assert pick(result, "joint", 1)["policy"] == "patience"
    assert any("settings chosen on dev" in w and "optimistic" in w for w in result["warnings"])
    assert "Warnings:" in (task_dir / TRADEOFF_MD).read_text()


def test_terminal_lines_fit_80_columns_one_per_cell(reports: Path, no_plots: None) -> None:
    """``aclpipe tradeoff``'s default print: per method and budget one line of at most 80
    characters with the layer speed-up, the score, the deployable engine's (onnx) measured
    speed-up at batch 1 / 32 and the setting; ``--full`` prints the rich tables."""
    write_metrics(reports / TASK, "deebert-sd", {1: 0.62, 2: 0.71, 3: 0.78, 4: 0.81})
    write_curves(reports / TASK, "deebert-sd", 0.81)  # the longest method name
    out = io.StringIO()
    result = tradeoff(TASK, reports, console=Console(file=out, width=80, color_system=None))
    lines = out.getvalue().splitlines()
    cells = [line for line in lines if line.split(" ")[0] in ("ce", "deebert-sd", "joint", "scl")]
    assert len(cells) == len(result["rows"]) == 4 * 4
    assert max(len(line) for line in lines[: lines.index(cells[-1]) + 1]) <= 80
    header = lines[lines.index(cells[0]) - 1]
    assert header.split() == ["method", "budget", "layer", "score", "onnx", "b1", "/", "b32",
                              "setting"]  # fmt: skip
    row = pick(result, "joint", 2)  # entropy@0.5: layer 2.00x, 78.50, onnx 1.85x / 1.95x
    assert (
        f"joint       ≤ 2 pts  2.00×  78.50  {row['onnx_speedup_batch1']:.2f}× / "
        f"{row['onnx_speedup_batch32']:.2f}×  entropy@0.5"
    ) in cells
    assert "│" not in out.getvalue() and "onnx/torch-full" not in out.getvalue()
    assert lines[-1].endswith("tradeoff.md (or --full)")
    full = io.StringIO()
    tradeoff(TASK, reports, console=Console(file=full, width=200, color_system=None), full=True)
    assert "│ joint" in full.getvalue() and "onnx/torch-full" in full.getvalue()
