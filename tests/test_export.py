"""export_exits on a tiny random BERT: files, ONNX segment parity, dev logits, standalone
folder, default exit setting, atomicity.

The ONNX exports (torch.export based, seconds per graph) run once per pooling for the module
and are marked slow; the segment modules, the dev-logit keys, the default setting and the
failure paths are fast tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from paths import at

from aclpipe.data.tasks import TASKS
from aclpipe.early_exit.settings import choose_default
from aclpipe.errors import UserError
from aclpipe.evaluation.scoring import all_exit_logits
from aclpipe.exits import segments as segments_module
from aclpipe.exits.export import dev_logits, export_exits
from aclpipe.exits.segments import EmbeddingsGraph, SegmentGraph, torch_chain
from aclpipe.layout import (
    CURVES_JSON,
    DEV_LOGITS,
    EMBEDDINGS_ONNX,
    EXPORT,
    EXPORT_JSON,
    EXPORT_TOKENIZER,
    META,
    METRICS,
    MODEL_CONFIG,
    TASK_FILE,
    WEIGHTS,
    segment_file,
    split_file,
)
from aclpipe.layout import EXPORT_MODEL as MODEL_FOLDER
from aclpipe.modeling.backbone import load_encoder, load_tokenizer, load_tokenizer_from
from aclpipe.modeling.model import ExitSpec, MultiExitModel, load_multi_exit

SENTENCES = [
    "good",
    "the movie was bad .",
    "this film is very very fun and great , the plot and the acting too .",
    "a dog sits on the mat",
    "it was not awful",
    "the story is so good and the woman plays the guitar .",
    "bad plot .",
    "she said he runs today and the cat sits on the mat , it was fun .",
]  # fmt: skip


def build_model(tiny_model_dir: Path, pooling: str, num_labels: int = 2) -> MultiExitModel:
    torch.manual_seed(0)
    spec = ExitSpec(num_labels=num_labels, exits=[1, 2, 3], pooling=pooling, dropout=0.1)
    return MultiExitModel(load_encoder(str(tiny_model_dir)), spec).eval()


def tokenized_rows(tokenizer, sentences: list[str]) -> list[dict]:
    encoded = tokenizer(sentences, truncation=True, max_length=32)
    return [
        {"input_ids": ids, "token_type_ids": types, "label": i % 2}
        for i, (ids, types) in enumerate(zip(encoded["input_ids"], encoded["token_type_ids"]))
    ]


def write_split(data_dir: Path, split: str, rows: list[dict]) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    (data_dir / f"{split}.jsonl").write_text(lines, encoding="utf-8")


def trained_folders(root: Path, tiny_model_dir: Path, pooling: str) -> tuple[Path, Path]:
    """A model folder as `aclpipe finetune` leaves it, and a prepared SST-2 data folder."""
    model_dir, data_dir = root / "model", at(root).data("sst2")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    build_model(tiny_model_dir, pooling).save(model_dir)
    tokenizer.save_pretrained(str(model_dir))
    write_split(data_dir, "dev", tokenized_rows(tokenizer, SENTENCES * 2))
    meta = {"task": "sst2", "splits": {"dev": {"examples": 2 * len(SENTENCES)}}}
    (data_dir / META).write_text(json.dumps(meta), encoding="utf-8")
    return model_dir, data_dir


@pytest.fixture(scope="module", params=["mean", "cls", "layer-attention"])
def exported(request, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict:
    root = tmp_path_factory.mktemp(f"export-{request.param}")
    model_dir, data_dir = trained_folders(root, tiny_model_dir, request.param)
    out_dir = root / EXPORT
    report = export_exits(TASKS["sst2"], model_dir, data_dir, out_dir, batch_size=4)
    return {"model_dir": model_dir, "data_dir": data_dir, "out": out_dir, "report": report}


GRAPHS = {EMBEDDINGS_ONNX, *(segment_file(end) for end in (1, 2, 3))}


@pytest.mark.slow
def test_export_writes_every_file(exported: dict) -> None:
    out, report = exported["out"], exported["report"]
    files = {p.name for p in out.iterdir()}
    assert files == {MODEL_FOLDER, DEV_LOGITS, EXPORT_JSON, EXPORT_TOKENIZER} | GRAPHS
    assert json.loads((out / EXPORT_JSON).read_text()) == report
    assert report["exits"] == [1, 2, 3] and report["labels"] == ["0", "1"]
    assert [s["file"] for s in report["segments"]] == sorted(GRAPHS - {EMBEDDINGS_ONNX})
    assert [s["layers"] for s in report["segments"]] == [[1, 1], [2, 2], [3, 3]]
    assert report["embeddings"]["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    all_layers = report["pooling"] == "layer-attention"
    assert report["states"] == ("all" if all_layers else "last")
    assert report["tolerance"] == 1e-4 and report["default_setting"]["source"] == "fallback"
    assert report["opset"] >= 18 and set(report["versions"]) >= {"torch", "onnxruntime"}
    model_files = {p.name for p in (out / MODEL_FOLDER).iterdir()}
    assert {WEIGHTS, MODEL_CONFIG, TASK_FILE} <= model_files
    assert not list(out.parent.glob(".tmp-*")) and not list(out.parent.glob(".old-*"))


@pytest.mark.slow
def test_onnx_chain_matches_pytorch(exported: dict) -> None:
    """The stored parity figures, and a fresh chain on other batch sizes and lengths."""
    import onnxruntime as ort

    report = exported["report"]
    gaps = [report["embeddings"]["max_abs_diff_states"]]
    for segment in report["segments"]:
        gaps += [segment[k] for k in segment if k.startswith(("max_abs", "chain_max"))]
    assert len(gaps) == 1 + 3 * 3 and all(0 <= gap < 1e-4 for gap in gaps)
    model = load_multi_exit(exported["model_dir"]).eval()
    tokenizer = load_tokenizer_from(exported["model_dir"])
    out = exported["out"]
    embed = ort.InferenceSession(str(out / EMBEDDINGS_ONNX))
    parts = [ort.InferenceSession(str(out / s["file"])) for s in report["segments"]]
    for texts in (SENTENCES[2:3], SENTENCES, SENTENCES[::-1] * 3):
        inputs = dict(tokenizer(texts, padding=True, return_tensors="pt"))  # [B, T] each
        with torch.no_grad():
            expected = model(**inputs).logits.numpy()  # [E, B, C]
        feed = {name: tensor.numpy() for name, tensor in inputs.items()}
        (states,) = embed.run(None, feed)  # [S, B, T, H]
        for e, session in enumerate(parts):
            states, logits = session.run(
                None, {"states": states, "attention_mask": feed["attention_mask"]}
            )
            assert logits.shape == expected[e].shape
            np.testing.assert_allclose(logits, expected[e], atol=1e-4, rtol=0)


def _fused_ops(path: Path, out: Path, disabled: list[str]) -> set[str]:
    """The op types of ``path`` after ONNX Runtime's graph optimisations."""
    import onnx
    import onnxruntime as ort

    from aclpipe.early_exit.onnx_runtime import session_options

    options = session_options(1)
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                         disabled_optimizers=disabled)  # fmt: skip
    return {node.op_type for node in onnx.load(str(out)).graph.node}


@pytest.mark.slow
def test_runtime_sessions_skip_the_slow_fusions(
    exported: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ONNX Runtime fuses a segment's Add + LayerNormalization and bias + Gelu by default; the
    runtime's sessions (and the export's checks, through the same function) do not."""
    import onnx

    from aclpipe.early_exit import onnx_runtime

    segment = exported["out"] / exported["report"]["segments"][0]["file"]
    fused = _fused_ops(segment, tmp_path / "default.onnx", [])
    assert {"SkipLayerNormalization", "BiasGelu"} <= fused  # the default does fuse
    plain = _fused_ops(segment, tmp_path / "runtime.onnx", list(onnx_runtime.SLOW_FUSIONS))
    assert not {"SkipLayerNormalization", "BiasGelu"} & plain
    assert "LayerNormalization" in plain
    seen = []  # open_session passes exactly those to onnxruntime
    real = onnx_runtime.session_options

    def recording(threads=None):
        options = real(threads)
        options.optimized_model_filepath = str(tmp_path / f"opened-{len(seen)}.onnx")
        seen.append(options.optimized_model_filepath)
        return options

    monkeypatch.setattr(onnx_runtime, "session_options", recording)
    onnx_runtime.OnnxEarlyExit(exported["out"], "none", None, threads=1)
    ops = [{n.op_type for n in onnx.load(f).graph.node} for f in seen]
    assert len(ops) == 1 + len(exported["report"]["segments"])
    assert not any({"SkipLayerNormalization", "BiasGelu"} & o for o in ops)


@pytest.mark.slow
def test_parity_above_tolerance_fails_the_export(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir, data_dir = trained_folders(tmp_path, tiny_model_dir, "mean")
    monkeypatch.setattr(segments_module, "TOLERANCE", -1.0)  # any difference is too large
    with pytest.raises(UserError, match=r"ONNX embeddings differs from PyTorch by") as err:
        export_exits(TASKS["sst2"], model_dir, data_dir, tmp_path / EXPORT)
    assert "\n" not in str(err.value) and not (tmp_path / EXPORT).exists()


@pytest.mark.slow
def test_dev_logits_equal_all_exit_logits(exported: dict) -> None:
    model = load_multi_exit(exported["model_dir"])
    rows = [json.loads(line) for line in split_file(exported["data_dir"], "dev").open()]
    expected = all_exit_logits(model, rows, batch_size=5, pad_id=0, regression=False)
    with np.load(exported["out"] / DEV_LOGITS) as saved:
        assert set(saved.files) == {"exits", "splits", "logits", "labels"}
        assert saved["logits"].shape == (3, len(rows), 2)  # [E, N, C]
        np.testing.assert_allclose(saved["logits"], expected, atol=1e-6, rtol=0)
        np.testing.assert_array_equal(saved["labels"], [r["label"] for r in rows])
        np.testing.assert_array_equal(saved["exits"], [1, 2, 3])
        assert list(saved["splits"]) == ["dev"]


@pytest.mark.slow
def test_exported_folder_loads_standalone(exported: dict, tmp_path: Path) -> None:
    """The model folder moved away from the training folder loads and gives the same logits."""
    from transformers import AutoTokenizer

    moved = tmp_path / "served"
    (exported["out"] / MODEL_FOLDER).rename(moved)
    try:
        standalone = load_multi_exit(moved).eval()
        tokenizer = AutoTokenizer.from_pretrained(str(moved))
        inputs = dict(tokenizer(SENTENCES, padding=True, return_tensors="pt"))
        original = load_multi_exit(exported["model_dir"]).eval()
        with torch.no_grad():
            torch.testing.assert_close(
                standalone(**inputs).logits, original(**inputs).logits, rtol=0, atol=0
            )
        assert json.loads((moved / TASK_FILE).read_text()) == {"task": "sst2", "labels": ["0", "1"]}
    finally:
        moved.rename(exported["out"] / MODEL_FOLDER)


@pytest.mark.parametrize("pooling", ["cls", "mean", "layer-attention"])
@pytest.mark.parametrize("token_types", [True, False])
def test_segment_chain_equals_model_exits(tiny_model_dir: Path, pooling: str, token_types: bool):
    """The modules that get exported, chained, compute exactly the model's exits (padding
    included); layer-attention carries h_0..h_k, the others h_k alone."""
    model = build_model(tiny_model_dir, pooling)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    inputs = dict(tokenizer(SENTENCES, SENTENCES[::-1], padding=True, return_tensors="pt"))
    if not token_types:
        inputs.pop("token_type_ids")
    embeddings = EmbeddingsGraph(model, use_token_types=token_types).eval()
    segments = [SegmentGraph(model, e).eval() for e in range(model.num_exits)]
    steps = torch_chain(embeddings, segments, inputs)
    with torch.no_grad():
        expected = model(**inputs).logits  # [E, B, C]
    for e, (states, logits) in enumerate(steps[1:]):
        torch.testing.assert_close(logits, expected[e], rtol=1e-5, atol=1e-5)
        depth = e + 2 if pooling == "layer-attention" else 1  # h_0..h_k, or h_k
        assert states.shape == (depth, *inputs["input_ids"].shape, 32)


def test_segments_hold_only_their_modules(tiny_model_dir: Path) -> None:
    model = build_model(tiny_model_dir, "mean")
    segment = SegmentGraph(model, 1)
    names = {name for name, _ in segment.named_parameters()}
    assert not any("embeddings" in name for name in names)
    assert {name.split(".")[1] for name in names if name.startswith("layers.")} == {"0"}
    assert all(p is q for p, q in zip(segment.layers[0].parameters(),
                                      model.encoder.encoder.layer[1].parameters()))  # fmt: skip


def write_reports(folder: Path, points: list[dict], reference: float) -> tuple[Path, Path]:
    curves, metrics = folder / CURVES_JSON, folder / METRICS
    full = {"score": 0.80, "expected_time_ratio": 1.0}
    curves.write_text(json.dumps({"split": "dev", "points": points, "full_model": full}))
    metrics.write_text(json.dumps({"final_score": reference}))
    return curves, metrics


def point(policy: str, threshold: float, score: float, speedup: float) -> dict:
    return {"policy": policy, "threshold": threshold, "score": score, "layer_speedup": speedup}


def test_default_setting_is_the_fastest_within_one_point(tmp_path: Path) -> None:
    points = [point("entropy", 0.1, 0.805, 1.2), point("entropy", 0.3, 0.795, 1.9),
              point("confidence", 0.8, 0.79, 2.5), point("patience", 1, 0.75, 3.0)]  # fmt: skip
    chosen = choose_default(*write_reports(tmp_path, points, reference=0.80))
    assert (chosen["policy"], chosen["threshold"], chosen["source"]) == (
        "confidence",
        0.8,
        "tradeoff",
    )
    assert chosen["layer_speedup"] == 2.5 and chosen["budget_points"] == 1
    # no early exit setting within the budget: the full model (no early exit)
    chosen = choose_default(*write_reports(tmp_path, points[3:], reference=0.80))
    assert chosen["policy"] == "none" and chosen["threshold"] is None


def test_default_setting_is_chosen_on_validation_when_there_is_one(tmp_path: Path) -> None:
    """Dev says confidence 0.8 (2.5x) is within a point; validation, where the choice is made,
    admits only entropy 0.3: that is the default, with its dev figures beside."""
    dev = [point("entropy", 0.3, 0.805, 1.9), point("confidence", 0.8, 0.80, 2.5)]
    validation = [point("entropy", 0.3, 0.83, 1.8), point("confidence", 0.8, 0.81, 2.4)]
    curves, metrics = write_reports(tmp_path, dev, reference=0.80)
    body = json.loads(curves.read_text())
    body["validation"] = {"full_model": {"score": 0.84}, "points": validation}
    curves.write_text(json.dumps(body))
    metrics.write_text(json.dumps({"final_score": 0.80, "splits": {"validation": {"final_score": 0.84}}}))
    chosen = choose_default(curves, metrics)
    assert (chosen["policy"], chosen["threshold"], chosen["split"]) == ("entropy", 0.3, "validation")
    assert chosen["reference_score"] == 0.84 and chosen["score"] == 0.83
    assert chosen["dev_score"] == 0.805 and chosen["dev_layer_speedup"] == 1.9
    # a ce reference without a validation score: the dev choice, and it says so
    metrics.write_text(json.dumps({"final_score": 0.80}))
    chosen = choose_default(curves, metrics)
    assert (chosen["policy"], chosen["split"]) == ("confidence", "dev") and "dev_score" not in chosen


def test_default_setting_falls_back_without_reports(tmp_path: Path) -> None:
    chosen = choose_default(tmp_path / CURVES_JSON, tmp_path / METRICS)
    assert (chosen["policy"], chosen["threshold"], chosen["source"]) == ("entropy", 0.3, "fallback")
    assert "no sweep in" in chosen["reason"]
    chosen = choose_default(tmp_path / CURVES_JSON, tmp_path / "m.json", regression=True)
    assert chosen["policy"] == "patience"


def test_dev_logit_keys_for_two_dev_splits(tiny_model_dir: Path, tmp_path: Path) -> None:
    """MNLI: `logits`/`labels` are dev_matched; the mismatched split gets suffixed keys."""
    model = build_model(tiny_model_dir, "mean", num_labels=3)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    write_split(tmp_path, "dev_matched", tokenized_rows(tokenizer, SENTENCES[:5]))
    write_split(tmp_path, "dev_mismatched", tokenized_rows(tokenizer, SENTENCES[5:]))
    arrays = dev_logits(TASKS["mnli"], model, tmp_path, batch_size=2)
    assert set(arrays) == {
        "exits", "splits", "logits", "labels", "logits_dev_mismatched", "labels_dev_mismatched",
    }  # fmt: skip
    assert arrays["logits"].shape == (3, 5, 3) and arrays["logits_dev_mismatched"].shape == (
        3,
        3,
        3,
    )
    assert list(arrays["splits"]) == ["dev_matched", "dev_mismatched"]


def test_missing_model_dir_is_one_line_user_error(tmp_path: Path) -> None:
    out = tmp_path / EXPORT
    with pytest.raises(UserError, match="no trained model") as err:
        export_exits(TASKS["sst2"], tmp_path / "absent", tmp_path / "data", out)
    assert "\n" not in str(err.value) and not out.exists()


def test_failed_export_leaves_previous_output(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporter fails after model/ was written: one-line error naming the exit, no trace."""
    model_dir, data_dir = trained_folders(tmp_path, tiny_model_dir, "mean")
    out = tmp_path / EXPORT
    out.mkdir()
    (out / "previous.txt").write_text("an earlier complete export")

    def broken_export(*args, **kwargs):
        raise RuntimeError("Unsupported operator aten::fancy_op\nlong traceback follows")

    monkeypatch.setattr(torch.onnx, "export", broken_export)
    with pytest.raises(UserError, match=r"the embeddings \(bert\).*aten::fancy_op") as err:
        export_exits(TASKS["sst2"], model_dir, data_dir, out)
    assert "\n" not in str(err.value) and "traceback" not in str(err.value)
    assert [p.name for p in out.iterdir()] == ["previous.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "export", "model"]
