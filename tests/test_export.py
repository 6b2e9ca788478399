"""export_exits on a tiny random BERT: files, ONNX parity, dev logits, standalone folder, atomicity.

The ONNX exports (torch.export based, seconds per exit) run once per pooling for the module
and are marked slow; the wrapper, the dev-logit keys and the failure paths are fast tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from aclpipe.data.tasks import TASKS
from aclpipe.early_exit.export import dev_logits, export_exits
from aclpipe.errors import UserError
from aclpipe.evaluation.scoring import all_exit_logits
from aclpipe.layout import DEV_LOGITS, EXPORT_JSON, TASK_FILE
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
    model_dir, data_dir = root / "model", root / "data" / "sst2"
    tokenizer = load_tokenizer(str(tiny_model_dir))
    build_model(tiny_model_dir, pooling).save(model_dir)
    tokenizer.save_pretrained(str(model_dir))
    write_split(data_dir, "dev", tokenized_rows(tokenizer, SENTENCES * 2))
    meta = {"task": "sst2", "splits": {"dev": {"examples": 2 * len(SENTENCES)}}}
    (data_dir / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return model_dir, data_dir


@pytest.fixture(scope="module", params=["mean", "cls"])
def exported(request, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict:
    root = tmp_path_factory.mktemp(f"export-{request.param}")
    model_dir, data_dir = trained_folders(root, tiny_model_dir, request.param)
    out_dir = root / "export"
    report = export_exits(TASKS["sst2"], model_dir, data_dir, out_dir, batch_size=4)
    return {"model_dir": model_dir, "data_dir": data_dir, "out": out_dir, "report": report}


@pytest.mark.slow
def test_export_writes_every_file(exported: dict) -> None:
    out, report = exported["out"], exported["report"]
    files = {p.name for p in out.iterdir()}
    onnx_files = {"exit_1.onnx", "exit_2.onnx", "exit_3.onnx"}
    assert files == {MODEL_FOLDER, DEV_LOGITS, EXPORT_JSON} | onnx_files
    assert json.loads((out / EXPORT_JSON).read_text()) == report
    assert report["exits"] == [1, 2, 3] and report["onnx_files"] == sorted(onnx_files)
    assert report["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert report["opset"] >= 18 and set(report["versions"]) >= {"torch", "onnxruntime"}
    model_files = {p.name for p in (out / MODEL_FOLDER).iterdir()}
    assert {"model.safetensors", "aclpipe_model.json", TASK_FILE} <= model_files
    assert "tokenizer_config.json" in model_files
    assert not list(out.parent.glob(".tmp-*")) and not list(out.parent.glob(".old-*"))


@pytest.mark.slow
def test_onnx_matches_pytorch(exported: dict) -> None:
    """The stored parity figures, and a fresh check on other batch sizes and lengths."""
    import onnxruntime as ort

    assert all(diff < 1e-4 for diff in exported["report"]["max_abs_diff"])
    model = load_multi_exit(exported["model_dir"]).eval()
    tokenizer = load_tokenizer_from(exported["model_dir"])
    for texts in (SENTENCES[2:3], SENTENCES, SENTENCES[::-1] * 3):
        inputs = dict(tokenizer(texts, padding=True, return_tensors="pt"))  # [B, T] each
        with torch.no_grad():
            expected = model(**inputs).logits.numpy()  # [E, B, C]
        feed = {name: tensor.numpy() for name, tensor in inputs.items()}
        for e, layer in enumerate(model.spec.exits):
            session = ort.InferenceSession(str(exported["out"] / f"exit_{layer}.onnx"))
            (logits,) = session.run(["logits"], feed)  # [B, C]
            assert logits.shape == expected[e].shape
            np.testing.assert_allclose(logits, expected[e], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_dev_logits_equal_all_exit_logits(exported: dict) -> None:
    model = load_multi_exit(exported["model_dir"])
    rows = [json.loads(line) for line in (exported["data_dir"] / "dev.jsonl").open()]
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
def test_exit_graph_equals_model_exit(tiny_model_dir: Path, pooling: str, token_types: bool):
    """The module that gets exported computes exactly the model's exit k (padding included)."""
    model = build_model(tiny_model_dir, pooling)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    inputs = dict(tokenizer(SENTENCES, SENTENCES[::-1], padding=True, return_tensors="pt"))
    if not token_types:
        inputs.pop("token_type_ids")
    with torch.no_grad():
        expected = model(**inputs).logits  # [E, B, C]
        for e in range(model.num_exits):
            graph = ExitGraph(model, e, use_token_types=token_types).eval()
            torch.testing.assert_close(graph(**inputs), expected[e], rtol=1e-5, atol=1e-5)


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
    out = tmp_path / "export"
    with pytest.raises(UserError, match="no trained model") as err:
        export_exits(TASKS["sst2"], tmp_path / "absent", tmp_path / "data", out)
    assert "\n" not in str(err.value) and not out.exists()


def test_failed_export_leaves_previous_output(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporter fails after model/ was written: one-line error naming the exit, no trace."""
    model_dir, data_dir = trained_folders(tmp_path, tiny_model_dir, "mean")
    out = tmp_path / "export"
    out.mkdir()
    (out / "previous.txt").write_text("an earlier complete export")

    def broken_export(*args, **kwargs):
        raise RuntimeError("Unsupported operator aten::fancy_op\nlong traceback follows")

    monkeypatch.setattr(torch.onnx, "export", broken_export)
    with pytest.raises(UserError, match=r"exit 1 \(bert\).*aten::fancy_op") as err:
        export_exits(TASKS["sst2"], model_dir, data_dir, out)
    assert "\n" not in str(err.value) and "traceback" not in str(err.value)
    assert [p.name for p in out.iterdir()] == ["previous.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "export", "model"]
