"""Results that mean nothing say so; two bad inputs that used to pass silently no longer do.

The majority-class floor (a constant prediction) in evaluate and tradeoff, the timing rule
(too few timed examples, measured speed-ups above their layer bound), STS-B scores outside
0-5, and blank lines fed to ``aclpipe predict``. Models are the tiny random BERT of
conftest.py; "constant" and "good" models are logits arrays patched in, so nothing trains.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import invoke, tree
from paths import at
from rich.console import Console

import aclpipe.stages.evaluate as evaluate_module
import aclpipe.stages.tradeoff
from aclpipe.config import EvaluateConfig
from aclpipe.data.glue_sources import read_local
from aclpipe.data.tasks import TASKS
from aclpipe.early_exit.predict import predict_lines
from aclpipe.errors import UserError
from aclpipe.evaluation import caveats
from aclpipe.evaluation.scoring import majority_prediction, majority_scores
from aclpipe.exits.sweep import check_engines, full_model_timing, speedups, sweep
from aclpipe.layout import (
    CURVES_CSV,
    CURVES_JSON,
    EXIT_SCORES_PNG,
    META,
    METRICS,
    TRADEOFF_MD,
    TRADEOFF_PNG,
    split_file,
)
from aclpipe.modeling.backbone import load_encoder, load_tokenizer
from aclpipe.modeling.model import ExitSpec, MultiExitModel
from aclpipe.stages.evaluate import (
    curves_csv,
    evaluate,
    render_curves,
    score_warnings,
    timing_warnings,
)
from aclpipe.stages.tradeoff import tradeoff
from aclpipe.stages.tradeoff_tables import ON_DEV

DOCS = Path(__file__).resolve().parents[1] / "docs" / "bad_inputs.md"
# The rows of docs/bad_inputs.md checked here (linked to this file), in the table's order.
DOC_CASES = ["stsb-score-out-of-range", "predict-blank-lines"]


def quiet() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=250, color_system=None), out


def save_model(folder: Path, tiny_model_dir: Path, num_labels: int = 2) -> Path:
    """A random 3-exit model with its tokenizer, as ``finetune`` leaves it."""
    torch.manual_seed(0)
    spec = ExitSpec(num_labels=num_labels, exits=[1, 2, 3], pooling="mean", dropout=0.1)
    MultiExitModel(load_encoder(str(tiny_model_dir)), spec).save(folder)
    load_tokenizer(str(tiny_model_dir)).save_pretrained(str(folder))
    return folder


# --- the majority-class floor ------------------------------------------------------------


@pytest.mark.parametrize(
    ("task", "prediction", "labels", "score"),
    [
        ("sst2", 1, [1, 1, 1, 0], 0.75),
        ("cola", 1, [1, 1, 1, 0], 0.0),  # MCC of a constant: undefined, scored 0
        ("mrpc", 1, [1, 1, 1, 0], (0.75 + 6 / 7) / 2),  # accuracy and F1 of a constant 1
        ("qqp", 0, [0, 0, 0, 1], (0.75 + 0.0) / 2),  # F1 of a constant 0 is 0
        ("stsb", 2.5, [0.5, 4.0, 3.2, 1.0], 0.0),  # correlations of a constant: 0
    ],
)
def test_majority_scores_per_task(task: str, prediction, labels: list, score: float) -> None:
    result = majority_scores(TASKS[task], prediction, np.array(labels))
    assert result["score"] == pytest.approx(score)
    assert list(result["metrics"]) == list(TASKS[task].metrics)


def write_prepared(folder: Path, labels: list, counts: dict | None) -> Path:
    folder.mkdir(parents=True)
    rows = "".join(json.dumps({"input_ids": [2, 3], "label": y}) + "\n" for y in labels)
    split_file(folder, "train").write_text(rows, encoding="utf-8")
    train = {"examples": len(labels)} | ({"labels": counts} if counts is not None else {})
    meta = {"task": folder.name, "splits": {"train": train}}
    (folder / META).write_text(json.dumps(meta), encoding="utf-8")
    return folder


def test_majority_prediction_from_meta_or_train(tmp_path: Path) -> None:
    # meta.json's counts decide (train.jsonl here disagrees, to show which one is read)
    assert majority_prediction(TASKS["sst2"], write_prepared(tmp_path / "a", [0], {"0": 3, "1": 5})) == 1  # fmt: skip
    # a tie goes to the lower label index
    assert majority_prediction(TASKS["sst2"], write_prepared(tmp_path / "b", [1], {"0": 4, "1": 4})) == 0  # fmt: skip
    # no counts in meta.json: train.jsonl's labels are counted
    mnli = write_prepared(tmp_path / "c", [2, 2, 1, 0, 2], None)
    assert majority_prediction(TASKS["mnli"], mnli) == 2
    # regression: the train mean
    stsb = write_prepared(tmp_path / "d", [1.0, 2.0], {"min": 1.0, "max": 2.0, "mean": 1.5})
    assert majority_prediction(TASKS["stsb"], stsb) == 1.5


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, make_project, tiny_model_dir: Path) -> Path:
    """SST-2 prepared (48 balanced train rows: the majority is label 0 by the tie rule; 16
    balanced dev rows: the floor is 50.00) and a random 3-exit model."""
    work = make_project(tmp_path_factory.mktemp("honest"))
    save_model(at(work).model("sst2", "ce"), tiny_model_dir)
    return work


def run_evaluate(project: Path, monkeypatch: pytest.MonkeyPatch, logits_for,
                 cfg: EvaluateConfig | None = None) -> tuple[dict, str]:  # fmt: skip
    """evaluate() with the all-exit logits replaced by ``logits_for(labels)``: ``[E, N, C]``."""

    def fake(model, rows, *args, **kwargs):
        return logits_for(np.array([r["label"] for r in rows]))

    monkeypatch.setattr(evaluate_module, "all_exit_logits", fake)
    console, out = quiet()
    out_dir = at(project).report("sst2", "ce")
    cfg = cfg or EvaluateConfig(batch_size=16, grid_points=3, timing_examples=0)
    report = evaluate(TASKS["sst2"], "ce", at(project).model("sst2", "ce"),
                      at(project).data("sst2"), out_dir, cfg, console=console)  # fmt: skip
    assert json.loads((out_dir / METRICS).read_text(encoding="utf-8")) == report
    return report, out.getvalue()


def constant_logits(labels: np.ndarray) -> np.ndarray:
    return np.tile(np.array([2.0, -2.0], dtype=np.float32), (3, len(labels), 1))  # [E, N, C]


def good_logits(labels: np.ndarray) -> np.ndarray:
    one_hot = np.eye(2, dtype=np.float32)[labels] * 4 - 2  # [N, C]
    return np.stack([one_hot] * 3)  # [E, N, C]


def test_constant_model_is_flagged_by_evaluate(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report, out = run_evaluate(project, monkeypatch, constant_logits)
    assert report["majority_score"] == report["splits"]["dev"]["majority_score"] == 0.5
    assert report["splits"]["dev"]["majority_metrics"] == {"accuracy": 0.5}
    assert report["majority_prediction"] == {"label": 0, "name": "0"}
    assert report["final_score"] == 0.5
    warning = (
        "warning: sst2/ce final exit 50.00 is at or below the majority-class score 50.00: "
        "the model has not learned the task; the speed-ups below mean nothing"
    )
    assert [line for line in out.splitlines() if line.startswith("warning")] == [warning]
    assert "majority" in out and "50.00" in out  # the column beside the per-exit scores


def test_good_model_is_not_flagged(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report, out = run_evaluate(project, monkeypatch, good_logits)
    assert report["final_score"] == 1.0 and report["majority_score"] == 0.5
    assert "warning" not in out


def test_cola_like_and_shallow_exit_warnings() -> None:
    def report(task: str, scores: list[float], majority: float) -> dict:
        per_exit = [{"layer": k, "score": s} for k, s in enumerate(scores, start=1)]
        split = {"per_exit": per_exit, "majority_score": majority}
        return {"task": task, "method": "joint", "splits": {"dev": split}}

    # CoLA: MCC 0.0 at every exit against a floor of 0 (a constant's MCC)
    (line,) = score_warnings(report("cola", [0.0, 0.0, 0.0], 0.0))
    assert line.startswith("warning: cola/joint final exit 0.00 is at or below")
    (line,) = score_warnings(report("sst2", [0.5, 0.49, 0.8], 0.5))
    assert line.startswith("warning: sst2/joint exits L1, L2 score at or below")
    assert score_warnings(report("sst2", [0.6, 0.7, 0.8], 0.5)) == []
    # metrics.json written before the floor existed: no warning, no error
    assert score_warnings(report("sst2", [0.4, 0.4, 0.4], None)) == []


# --- the timing rule ------------------------------------------------------------------------


def test_timing_floor() -> None:
    assert caveats.too_few_timed(16) == [1, 32]
    assert caveats.too_few_timed(32) == [32]
    assert caveats.too_few_timed(64) == []
    assert caveats.too_few_timed(0) == []  # not timed: nothing to distrust
    assert caveats.timing_note(16, 3) == (
        "timed on 16 dev examples (median of 3 repeats): too few to trust "
        "(batch 1 needs 32, batch 32 needs 64)"
    )
    assert caveats.timing_note(64) == "timed on 64 dev examples"


def curves_with(measured: float, examples: int = 64, onnx: float | None = None) -> dict:
    """One point with bound 6.0; ``onnx``: ONNX Runtime's own speed-up at batch 1 (else a
    curves.json from before the onnx engine)."""
    point = {"policy": "confidence", "threshold": 0.5, "score": 0.5, "mean_exit_layer": 1.0,
             "layer_speedup": 6.0, "timed_layer_speedup": 6.0,
             "measured_speedup_batch1": measured, "measured_speedup_batch32": 5.0}  # fmt: skip
    if onnx is not None:
        point.update(onnx_speedup_batch1=onnx, onnx_speedup_batch32=5.5,
                     onnx_vs_torch_full_batch1=15.0, onnx_vs_torch_full_batch32=11.0)  # fmt: skip
    return {"task": "cola", "method": "joint", "timing_examples": examples, "timing_repeats": 3,
            "points": [point]}  # fmt: skip


def render(table) -> str:
    console, out = quiet()
    console.print(table)
    return out.getvalue()


def test_measured_above_the_bound_is_noise() -> None:
    noisy = curves_with(6.89)
    assert "6.89x*" in render(render_curves(noisy)) and "5.00x*" not in render(render_curves(noisy))
    (line,) = timing_warnings(noisy)
    assert line == (
        "warning: cola/joint: 1 measured speed-up above the layer speed-up bound by more than "
        "5% (largest 6.89x against 6.00x, confidence@0.5 at batch 1; timed on 64 dev examples "
        "(median of 3 repeats)): timing noise, marked *"
    )
    assert timing_warnings(curves_with(6.2)) == []  # within 5% of the bound
    assert "*" not in render(render_curves(curves_with(6.2))).split("speed-ups")[0]
    few = timing_warnings(curves_with(3.0, examples=16))
    assert few == [
        "warning: cola/joint speed-ups timed on 16 dev examples: too few to trust (batch 1 "
        "needs 32, batch 32 needs 64); raise evaluate.timing_examples"
    ]
    assert "too few to trust" in render(render_curves(curves_with(3.0, examples=16)))


def test_onnx_speedups_shown_and_judged_by_the_same_bound() -> None:
    """ONNX Runtime's early exit over its own full model has the layer bound; over the full
    PyTorch model it has none (the engine's own gain), so 15x there is not marked."""
    curves = curves_with(6.2, onnx=6.89)
    table = render(render_curves(curves))
    header = next(line for line in table.splitlines() if "policy" in line)
    assert [h.strip() for h in header.strip("┃│ ").split("┃")][5:] == [
        "torch b1", "torch b32", "onnx b1", "onnx b32", "onnx/torch-full b1", "onnx/torch-full b32"
    ]  # fmt: skip
    assert "6.20x " in table and "6.89x*" in table and "15.00x " in table and "15.00x*" not in table
    assert "onnx/torch-full: the full PyTorch model's time" in table  # the caption: which is which
    (line,) = timing_warnings(curves)
    assert "1 measured speed-up above" in line and "confidence@0.5 (onnx) at batch 1" in line
    rows = curves_csv(curves["points"]).splitlines()
    assert rows[0].endswith(",measured_speedup_batch1,measured_speedup_batch32,onnx_speedup_batch1,"
                            "onnx_speedup_batch32,onnx_vs_torch_full_batch1,onnx_vs_torch_full_batch32")  # fmt: skip
    assert rows[1].endswith(",6.2,5,6.89,5.5,15,11")
    old = curves_with(2.0)  # written before the onnx engine: empty cells, "-" in the table
    assert curves_csv(old["points"]).splitlines()[1].endswith(",2,5,,,,")
    assert render(render_curves(old)).count(" - ") >= 4


@pytest.mark.slow
def test_evaluate_times_the_engines_it_is_given(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """evaluate.engines reaches the sweep: [torch] times PyTorch alone, onnx columns stay empty."""
    cfg = EvaluateConfig(batch_size=16, grid_points=3, timing_examples=4, timing_repeats=1,
                         engines=["torch"])  # fmt: skip
    run_evaluate(project, monkeypatch, good_logits, cfg)
    folder = at(project).report("sst2", "ce")
    curves = json.loads((folder / CURVES_JSON).read_text(encoding="utf-8"))
    assert curves["timing_engines"] == ["torch"]
    assert all(p["measured_speedup_batch1"] > 0 and "onnx_speedup_batch1" not in p
               for p in curves["points"])  # fmt: skip
    header, first = (folder / CURVES_CSV).read_text(encoding="utf-8").splitlines()[:2]
    assert header.split(",")[-4:] == ["onnx_speedup_batch1", "onnx_speedup_batch32",
                                      "onnx_vs_torch_full_batch1", "onnx_vs_torch_full_batch32"]  # fmt: skip
    assert first.endswith(",,,,") and float(first.split(",")[6]) > 0


ONNX_KEYS = ("onnx_speedup", "onnx_vs_torch_full")


@pytest.mark.parametrize("engines", [("torch", "onnx"), ("torch",)])
@pytest.mark.slow
def test_sweep_records_the_timed_bound(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engines: tuple
) -> None:
    """Every engine's speed-ups, per point and batch size; the onnx engine's temporary
    segments are gone afterwards. Sizes are not checked: timings are noise on a tiny model."""
    from aclpipe.early_exit.policies import exit_indices
    from aclpipe.modeling.model import load_multi_exit

    model = load_multi_exit(save_model(tmp_path / "m", tiny_model_dir))
    rows = [{"input_ids": [2, 5 + i % 7, 6, 3][: 2 + i % 3], "label": i % 2} for i in range(6)]
    logits = np.random.default_rng(0).normal(size=(3, 6, 2)).astype(np.float32)  # [E, N, C]
    labels = np.array([r["label"] for r in rows])
    index = [1, 2, 3]  # lengths 3, 4, 2: a padded batch at batch 32
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = sweep(TASKS["sst2"], model, logits, labels, [rows[i] for i in index], 0, 3, 1, 0.1,
                index, engines)  # fmt: skip
    assert (out["timing_examples"], out["timing_repeats"], out["timing_batch_sizes"]) == (3, 1, [1, 32])  # fmt: skip
    assert out["timing_engines"] == list(engines)
    assert list(scratch.iterdir()) == []
    full = out["full_model"]
    keys = ["measured_speedup", *(ONNX_KEYS if "onnx" in engines else ())]
    for point in out["points"]:
        chosen = exit_indices(point["policy"], point["threshold"], logits[:, index])
        assert point["timed_layer_speedup"] == pytest.approx(3 * 3 / (chosen + 1).sum())
        speedups = {k: v for k, v in point.items() if k.endswith(("_batch1", "_batch32"))}
        assert sorted(speedups) == sorted(f"{k}_batch{b}" for k in keys for b in (1, 32))
        assert all(np.isfinite(v) and v > 0 for v in speedups.values()), speedups
        if "onnx" in engines:  # both ratios share the same ONNX early-exit time
            for b in (1, 32):
                ratio = point[f"onnx_vs_torch_full_batch{b}"] / point[f"onnx_speedup_batch{b}"]
                assert ratio == pytest.approx(full[f"onnx_vs_torch_full_batch{b}"])
    for b in (1, 32):
        assert full[f"seconds_batch{b}"] > 0
        if "onnx" in engines:
            assert full[f"onnx_vs_torch_full_batch{b}"] == pytest.approx(
                full[f"seconds_batch{b}"] / full[f"onnx_seconds_batch{b}"]
            )
        else:
            assert f"onnx_seconds_batch{b}" not in full
            assert f"onnx_vs_torch_full_batch{b}" not in full


def test_speedups_per_engine() -> None:
    """Each ratio from the seconds of the engines timed, and only those."""
    seconds = {"torch": {"full": 6.0, "settings": [3.0]}, "onnx": {"full": 2.0, "settings": [0.5]}}
    assert speedups(seconds, 0, 1) == {"measured_speedup_batch1": 2.0, "onnx_speedup_batch1": 4.0,
                                       "onnx_vs_torch_full_batch1": 12.0}  # fmt: skip
    assert speedups({"torch": seconds["torch"]}, 0, 32) == {"measured_speedup_batch32": 2.0}
    assert speedups({"onnx": seconds["onnx"]}, 0, 1) == {"onnx_speedup_batch1": 4.0}
    assert full_model_timing({1: seconds}) == {"seconds_batch1": 6.0, "onnx_seconds_batch1": 2.0,
                                               "onnx_vs_torch_full_batch1": 3.0}  # fmt: skip


def test_onnx_engine_without_onnxruntime_is_one_line(
    project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Asked for and not installed: one line, before the dev split is scored (no fallback)."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    monkeypatch.setattr(evaluate_module, "all_exit_logits", lambda *a, **k: pytest.fail("scored"))
    cfg = EvaluateConfig(batch_size=16, grid_points=3, timing_examples=4)
    with pytest.raises(UserError) as err:
        evaluate(TASKS["sst2"], "ce", at(project).model("sst2", "ce"),
                 at(project).data("sst2"), tmp_path / "out", cfg, console=quiet()[0])  # fmt: skip
    assert str(err.value) == (
        "evaluate.engines lists onnx, but onnxruntime is not installed: `pip install "
        "onnxruntime`, or time PyTorch alone (evaluate.engines: [torch])"
    )
    assert not (tmp_path / "out").exists()
    check_engines(["torch"])  # PyTorch alone needs no onnxruntime


# --- the trade-off report -------------------------------------------------------------------


def write_result(task_dir: Path, method: str, scores: dict[int, float], majority: float,
                 measured: float | None = None, examples: int = 64) -> None:  # fmt: skip
    per_exit = [{"layer": k, "metrics": {"accuracy": s}, "score": s} for k, s in scores.items()]
    final, avg = list(scores.values())[-1], sum(scores.values()) / len(scores)
    split = {"examples": 100, "per_exit": per_exit, "final_score": final,
             "average_over_exits": avg, "majority_score": majority}  # fmt: skip
    metrics = {"task": "qnli", "method": method, "exits": list(scores), "splits": {"dev": split},
               "final_score": final, "average_over_exits": avg, "majority_score": majority}  # fmt: skip
    (task_dir / method).mkdir(parents=True, exist_ok=True)
    (task_dir / method / METRICS).write_text(json.dumps(metrics), encoding="utf-8")
    if measured is None:
        return
    point = {"policy": "confidence", "threshold": 0.5, "score": scores[1], "mean_exit_layer": 1,
             "expected_time_ratio": 1 / 3, "layer_speedup": 3.0, "timed_layer_speedup": 3.0,
             "measured_speedup_batch1": measured, "measured_speedup_batch32": 2.0}  # fmt: skip
    curves = {"task": "qnli", "method": method, "exits": list(scores), "num_layers": 3,
              "timing_examples": examples, "timing_repeats": 3,
              "full_model": {"score": final}, "points": [point]}  # fmt: skip
    (task_dir / method / CURVES_JSON).write_text(json.dumps(curves), encoding="utf-8")


@pytest.fixture
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aclpipe.stages.tradeoff, "draw_score_vs_time", lambda *args: None)
    monkeypatch.setattr(aclpipe.stages.tradeoff, "draw_exit_scores", lambda *args: None)


@pytest.mark.slow
def test_tradeoff_marks_a_model_at_chance(tmp_path: Path) -> None:
    """QNLI at chance: ce 52.10 against a floor of 51.50, joint's full model at 51.00."""
    task_dir = at(tmp_path).reports("qnli")
    write_result(task_dir, "ce", {3: 0.521}, 0.515)
    write_result(task_dir, "joint", {1: 0.51, 2: 0.51, 3: 0.51}, 0.515, measured=3.4, examples=16)
    console, out = quiet()
    report = tradeoff("qnli", at(tmp_path).reports(), console=console)  # draws both plots
    assert report["majority"] == 0.515
    expected = [
        f"warning: qnli: {ON_DEV}",  # these results have no validation sweep
        "warning: qnli/joint full model 51.00 is at or below the majority-class score 51.50: "
        "the model has not learned the task; its speed-ups mean nothing",
        *(f"warning: qnli budget '{name}' admits scores down to {floor}, at or below the "
          "majority-class score 51.50: a constant guess meets it, so it admits exiting "
          "everything at layer 1"
          for name, floor in [("≤ 1 pt drop", "51.10"), ("≤ 2 pts drop", "50.10"),
                              ("≤ 5 pts drop", "47.10")]),
        "warning: qnli/joint speed-ups timed on 16 dev examples: too few to trust (batch 1 "
        "needs 32, batch 32 needs 64); raise evaluate.timing_examples",
        "warning: qnli/joint: 1 measured speed-up above the layer speed-up bound by more than "
        "5% (largest 3.40x against 3.00x, confidence@0.5 at batch 1; timed on 16 dev examples: "
        "too few to trust (batch 1 needs 32, batch 32 needs 64)): timing noise, marked *",
    ]  # fmt: skip
    assert report["warnings"] == expected
    assert [line for line in out.getvalue().splitlines() if line.startswith("warning")] == report["warnings"]  # fmt: skip
    md = (task_dir / TRADEOFF_MD).read_text(encoding="utf-8")
    header = next(line for line in md.splitlines() if line.startswith("| method | no drop"))
    assert header.count("(floor ≤ majority)") == 3 and "no drop (floor" not in header
    assert md.count("Majority-class score 51.50") == 2  # beside both tables
    assert "| joint (≤ majority) |" in md and "| ce |" in md
    assert "3.40×*" in md and "too few to trust" in md
    assert "- qnli/joint full model 51.00" in md  # the warnings, in the report too
    for png in (TRADEOFF_PNG, EXIT_SCORES_PNG):
        assert (task_dir / png).read_bytes().startswith(b"\x89PNG")


def test_tradeoff_good_models_carry_no_marks(tmp_path: Path, no_plots: None) -> None:
    task_dir = at(tmp_path).reports("qnli")
    write_result(task_dir, "ce", {3: 0.90}, 0.505)
    write_result(task_dir, "joint", {1: 0.85, 2: 0.88, 3: 0.90}, 0.505, measured=2.9)
    console, out = quiet()
    report = tradeoff("qnli", at(tmp_path).reports(), console=console)
    assert report["warnings"] == [f"warning: qnli: {ON_DEV}"]  # no validation sweep: said
    assert out.getvalue().count("warning") == 1
    md = (task_dir / TRADEOFF_MD).read_text(encoding="utf-8")
    assert "≤ majority" not in md and "×*" not in md and md.count(ON_DEV) == 1
    assert "Majority-class score 50.50" in md and "timed on 64 dev examples" in md


def test_tradeoff_reads_results_without_the_floor(tmp_path: Path, no_plots: None) -> None:
    """metrics.json written before majority_score existed: said, not an error."""
    task_dir = at(tmp_path).reports("qnli")
    write_result(task_dir, "ce", {3: 0.52}, 0.0)
    metrics = json.loads((task_dir / "ce" / METRICS).read_text(encoding="utf-8"))
    del metrics["majority_score"]
    (task_dir / "ce" / METRICS).write_text(json.dumps(metrics), encoding="utf-8")
    report = tradeoff("qnli", at(tmp_path).reports(), console=quiet()[0])
    assert report["majority"] is None and report["warnings"] == [f"warning: qnli: {ON_DEV}"]
    assert "not recorded" in (task_dir / TRADEOFF_MD).read_text(encoding="utf-8")


# --- bad inputs: STS-B scores outside 0-5, blank lines in predict -------------------------

STSB_HEADER = (
    "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
)


def stsb_row(score: str) -> str:
    return f"1\tg\tf\t2012\t0001\tnone\tnone\ta man plays\tthe man plays\t{score}\n"


@pytest.mark.parametrize("score", ["7.5", "-0.5", "5.01"])
def test_stsb_score_out_of_range(tmp_path: Path, score: str) -> None:
    path = tmp_path / "STS-B" / "dev.tsv"
    path.parent.mkdir()
    path.write_text(STSB_HEADER + stsb_row("2.5") + stsb_row(score), encoding="utf-8")
    with pytest.raises(UserError) as err:
        read_local(TASKS["stsb"], tmp_path, "dev")
    assert str(err.value) == (
        f"{path}, line 3: score '{score}' is outside STS-B's range 0 to 5; fix the score "
        "column (a float from 0 to 5)"
    )


def test_stsb_score_at_the_ends_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "STS-B" / "dev.tsv"
    path.parent.mkdir()
    path.write_text(STSB_HEADER + stsb_row("0") + stsb_row("5.000"), encoding="utf-8")
    assert [e.label for e in read_local(TASKS["stsb"], tmp_path, "dev")] == [0.0, 5.0]


def test_stsb_score_out_of_range_cli(
    make_project, glue_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = make_project(tmp_path / "work")
    bad = work / "glue-bad"
    shutil.copytree(glue_dir, bad)
    train = bad / "STS-B" / "train.tsv"
    lines = train.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[4] = lines[4].rsplit("\t", 1)[0] + "\t7.5\n"
    train.write_text("".join(lines), encoding="utf-8")
    monkeypatch.chdir(work)
    monkeypatch.delenv("GLUE_DIR", raising=False)
    before = tree(work)
    result = invoke("prepare", "--task", "stsb", "--glue-dir", "glue-bad")
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "error: glue-bad/STS-B/train.tsv, line 5: score '7.5' is outside STS-B's range 0 to 5; "
        "fix the score column (a float from 0 to 5)"
    ]
    assert tree(work) == before


BLANKY = ["the movie was good .\n", "\n", "bad plot\n", "  \t \n", "it was fun .\n", "\n"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return save_model(tmp_path_factory.mktemp("predict") / "model", tiny_model_dir)


@pytest.mark.parametrize("batch_size", [1, 2, 32])
def test_blank_lines_keep_their_place(
    model_dir: Path, batch_size: int, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = list(predict_lines(model_dir, BLANKY, "entropy", 0.3, batch_size=batch_size))
    assert [r["text"] for r in rows] == [line.rstrip("\n") for line in BLANKY]
    for number, row in enumerate(rows, start=1):
        if number in (2, 4, 6):
            assert row == {"label": None, "probability": None, "exit_layer": None,
                           "text": BLANKY[number - 1].rstrip("\n"), "error": "blank line"}  # fmt: skip
        else:
            assert row["label"] in (0, 1) and "error" not in row
    assert capsys.readouterr().err.splitlines() == [
        'note: 3 blank input lines (lines 2, 4, 6) got a record with a null label and "error": '
        '"blank line", so output line n still answers input line n'
    ]
    # the answers of the other lines are those without the blank lines
    plain = list(predict_lines(model_dir, [x for x in BLANKY if x.strip()], "entropy", 0.3))
    assert [r for r in rows if "error" not in r] == plain
    assert capsys.readouterr().err == ""


def test_only_blank_lines(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = list(predict_lines(model_dir, ["\n", "\n"], "confidence", 0.9))
    assert [r["error"] for r in rows] == ["blank line"] * 2
    assert capsys.readouterr().err.startswith("note: 2 blank input lines (lines 1, 2)")


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_blank_lines_cli(model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                         source: str) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    Path("in.txt").write_text("".join(BLANKY), encoding="utf-8")
    args = ["predict", "--model", str(model_dir), "--output", "out.jsonl"]
    if source == "file":
        result = invoke(*args, "--input", "in.txt")
    else:
        from typer.testing import CliRunner

        from aclpipe.cli import app

        result = CliRunner().invoke(app, [*args, "--input", "-"], input="".join(BLANKY))
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in Path("out.jsonl").read_text().splitlines()]
    assert len(records) == len(BLANKY)
    assert [r.get("error") for r in records] == [None, "blank line", None, "blank line", None,
                                                  "blank line"]  # fmt: skip
    notes = result.stderr.splitlines()  # the blank-line note, then the throughput line
    assert len(notes) == 2 and "3 blank input lines" in notes[0] and "sentences/s" in notes[1]


def test_docs_show_these_cases() -> None:
    """The rows of docs/bad_inputs.md that link here, in order, with four filled cells."""
    rows = [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        for line in DOCS.read_text(encoding="utf-8").splitlines()
        if "test_honest_results.py" in line and line.startswith("| [")
    ]
    assert [re.match(r"\[`([^`]+)`\]", row[0]).group(1) for row in rows] == DOC_CASES
    assert all(len(row) == 4 and all(row) for row in rows)
