"""Early exit on ONNX Runtime against the PyTorch runtime, and ``predict`` as a batch tool.

A tiny random BERT is exported once per pooling for the module (seconds: these tests are
slow); the tokenizer and input-format tests need no export and are fast.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_export import SENTENCES, trained_folders

from aclpipe.data.tasks import TASKS
from aclpipe.early_exit.inputs import records
from aclpipe.early_exit.onnx_runtime import OnnxEarlyExit
from aclpipe.early_exit.policies import POLICIES, default_grid
from aclpipe.early_exit.predict import predict_lines
from aclpipe.early_exit.runtime import EarlyExitRuntime
from aclpipe.early_exit.tokens import encode, load_fast_tokenizer, pad
from aclpipe.errors import UserError
from aclpipe.exits.export import export_exits, write_tokenizer_file
from aclpipe.layout import EXPORT, EXPORT_JSON, EXPORT_TOKENIZER
from aclpipe.modeling.backbone import load_tokenizer
from aclpipe.modeling.model import load_multi_exit

# A policy value this close to its threshold may fall on either side in another engine.
NEAR = 1e-5
LOGITS_TOLERANCE = 1e-4
PAIRS = [(a, b) for a, b in zip(SENTENCES, SENTENCES[::-1])]


@pytest.fixture(scope="module", params=["mean", "layer-attention"])
def export_dir(request, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp(f"serve-{request.param}")
    model_dir, data_dir = trained_folders(root, tiny_model_dir, request.param)
    export_exits(TASKS["sst2"], model_dir, data_dir, root / EXPORT, batch_size=4)
    return root / EXPORT


def near_threshold(policy: str, threshold: float, exits_logits: list[list[float]]) -> bool:
    """Whether a sample's policy value sits within ``NEAR`` of the threshold at some exit
    before the last (patience: a top-two margin within ``NEAR``, an argmax that may flip)."""
    for logits in exits_logits[:-1]:
        top = max(logits)
        exp = [math.exp(z - top) for z in logits]
        total = sum(exp)
        if policy == "confidence":
            value = 1.0 / total
        elif policy == "entropy":
            value = math.log(total) - sum(e * (z - top) for e, z in zip(exp, logits)) / total
        else:
            second = sorted(logits)[-2]
            if top - second <= NEAR:
                return True
            continue
        if abs(value - threshold) <= NEAR:
            return True
    return False


@pytest.mark.slow
def test_onnx_runtime_agrees_with_pytorch(export_dir: Path) -> None:
    """Every policy over its threshold grid, on padded batches of sentences and of pairs:
    identical exits except samples within NEAR of a threshold (counted, printed), logits
    within LOGITS_TOLERANCE."""
    model = load_multi_exit(export_dir / "model").eval()
    tokenizer = load_fast_tokenizer(export_dir / EXPORT_TOKENIZER, 32)
    batches = [
        pad(encode(tokenizer, [(s, None) for s in SENTENCES]), 0),
        pad(encode(tokenizer, PAIRS), 0),
        pad(encode(tokenizer, [(SENTENCES[2], None)]), 0),  # batch 1, no padding
    ]  # [B, T] each
    compared = near = 0
    for batch in batches:
        with torch.no_grad():
            every_exit = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits
        per_sample = every_exit.transpose(0, 1).tolist()  # [B][E][C]
        for policy in POLICIES:
            for threshold in default_grid(policy, 2, 3):
                expected = EarlyExitRuntime(model, policy, threshold)(
                    **{k: torch.from_numpy(v) for k, v in batch.items()}
                )
                got = OnnxEarlyExit(export_dir, policy, threshold)(**batch)
                same = got.exit_index == expected.exit_index.numpy()
                for i in np.flatnonzero(~same):
                    assert near_threshold(policy, threshold, per_sample[i]), (policy, threshold, i)
                near += int((~same).sum())
                compared += len(same)
                np.testing.assert_array_equal(got.exit_layer[same], expected.exit_layer[same])
                gap = np.abs(got.logits[same] - expected.logits.numpy()[same])
                assert gap.max(initial=0.0) <= LOGITS_TOLERANCE, (policy, threshold)
    print(f"\n{compared} sample-settings compared, {near} exits differ near a threshold")
    assert compared > 0 and near <= compared // 100  # at most 1%, all of them near a threshold


@pytest.mark.slow
def test_policy_none_is_the_last_exit(export_dir: Path) -> None:
    model = load_multi_exit(export_dir / "model").eval()
    tokenizer = load_fast_tokenizer(export_dir / EXPORT_TOKENIZER, 32)
    batch = pad(encode(tokenizer, [(s, None) for s in SENTENCES]), 0)
    got = OnnxEarlyExit(export_dir, "none", None)(**batch)
    with torch.no_grad():
        expected = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits[-1]
    assert (got.exit_layer == 3).all()
    np.testing.assert_allclose(got.logits, expected.numpy(), atol=LOGITS_TOLERANCE, rtol=0)
    # evaluate's sweep: one load of the graphs, every setting on the same sessions
    loaded = OnnxEarlyExit(export_dir, "confidence", 0.6)
    full = loaded.with_setting("none", None)
    assert full.segments is loaded.segments and loaded.policy == "confidence"
    np.testing.assert_array_equal(full(**batch).logits, got.logits)
    with pytest.raises(UserError, match="entropy threshold"):
        loaded.with_setting("entropy", 5.0)


BLOCKER = """
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"{name} is blocked: a serving box has no training stack")
        return None
sys.meta_path.insert(0, Block())
from aclpipe.cli import app
try:
    app(sys.argv[1:])
except SystemExit as e:
    assert not e.code, e.code
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))))
"""


@pytest.mark.slow
def test_predict_onnx_runs_without_torch_or_transformers(export_dir: Path, tmp_path: Path):
    """`aclpipe predict --engine onnx` with torch and transformers impossible to import gives
    the answers of the torch engine (same exits, probabilities within 1e-5)."""
    source = tmp_path / "in.txt"
    source.write_text("\n".join([*SENTENCES, "", "bad plot , good film ."]) + "\n")
    args = ["predict", "--model", str(export_dir), "--input", str(source), "--policy",
            "entropy", "--threshold", "0.69", "--engine", "onnx", "--output"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER, *args, str(tmp_path / "out.jsonl")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert "sentences/s" in done.stderr.splitlines()[-1]
    assert "mean exit layer" in done.stderr.splitlines()[-1]
    got = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    lines = source.read_text().splitlines()
    expected = list(predict_lines(export_dir, lines, "entropy", 0.69, engine="torch"))
    assert [r["text"] for r in got] == lines
    for a, b in zip(got, expected):
        assert a["exit_layer"] == b["exit_layer"] and a["label"] == b["label"]
        if a["probability"] is not None:
            assert a["probability"] == pytest.approx(b["probability"], abs=1e-5)


@pytest.mark.slow
def test_formats_sorting_and_defaults(export_dir: Path, tmp_path: Path) -> None:
    """Text, TSV and JSONL give the same records; batches are sorted by length internally but
    records come back in input order, each the answer of its sentence alone."""
    lines = [*SENTENCES, "", *SENTENCES[::-1]]
    text_rows = list(predict_lines(export_dir, lines, batch_size=3))
    alone = [next(predict_lines(export_dir, [line])) if line else None for line in lines]
    for row, single in zip(text_rows, alone):
        if single is None:
            assert row["error"] == "blank line"
        else:
            assert row["text"] == single["text"] and row["exit_layer"] == single["exit_layer"]
            assert row["probability"] == pytest.approx(single["probability"], abs=1e-5)
    tsv = ["sentence\n", *(f"{line}\n" for line in lines)]
    jsonl = [json.dumps({"text": line}) + "\n" if line else "\n" for line in lines]
    assert list(predict_lines(export_dir, tsv, batch_size=3, fmt="tsv")) == text_rows
    assert list(predict_lines(export_dir, jsonl, batch_size=3, fmt="jsonl")) == text_rows
    pairs_tsv = ["text_a\ttext_b\n", *(f"{a}\t{b}\n" for a, b in PAIRS)]
    pairs_jsonl = [json.dumps({"text_a": a, "text_b": b}) + "\n" for a, b in PAIRS]
    pairs_text = [f"{a}\t{b}" for a, b in PAIRS]
    with pytest.raises(UserError, match=r"names two texts, but this model \(sst2\) reads one"):
        list(predict_lines(export_dir, pairs_tsv, fmt="tsv"))  # a pair TSV, an SST-2 export
    two_texts = r"^input line 1 holds two texts, but this model \(sst2\)"
    for fmt, pairs in (("jsonl", pairs_jsonl), ("text", pairs_text)):  # checked record by record
        with pytest.raises(UserError, match=two_texts):
            list(predict_lines(export_dir, pairs, fmt=fmt))
    anything = tmp_path / "forgot-task"  # the same model, its task forgotten: it reads pairs too
    shutil.copytree(export_dir, anything)
    record = json.loads((anything / EXPORT_JSON).read_text(encoding="utf-8"))
    del record["task"]
    (anything / EXPORT_JSON).write_text(json.dumps(record), encoding="utf-8")
    expected = list(predict_lines(anything, pairs_text))
    assert list(predict_lines(anything, pairs_jsonl, fmt="jsonl")) == expected
    assert list(predict_lines(anything, pairs_tsv, fmt="tsv")) == expected


@pytest.mark.slow
def test_model_option_takes_the_export_folder(export_dir: Path, tmp_path: Path) -> None:
    from cli_helpers import invoke

    (tmp_path / "in.jsonl").write_text('{"text": "good film ."}\n\n{"text": "bad plot"}\n')
    out = tmp_path / "out.jsonl"
    result = invoke("predict", "--model", str(export_dir), "--input", str(tmp_path / "in.jsonl"),
                    "--output", str(out), "--policy", "none")  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["exit_layer"] for r in rows] == [3, None, 3]
    assert result.stderr.splitlines()[-1].startswith("2 sentences, ")
    assert "policy none (given)" in result.stderr


def test_fast_tokenizer_file_gives_the_hf_ids(tiny_model_dir: Path, tmp_path: Path) -> None:
    """tokenizer.json read by `tokenizers` with predict's settings = the HF tokenizer called
    as training and the torch engine call it (truncation, pair template, type ids)."""
    hf = load_tokenizer(str(tiny_model_dir))
    write_tokenizer_file(hf, tmp_path / EXPORT_TOKENIZER)
    long = " ".join(SENTENCES)
    for max_length in (128, 9):
        fast = load_fast_tokenizer(tmp_path / EXPORT_TOKENIZER, max_length)
        texts = [(s, None) for s in [*SENTENCES, long]] + [*PAIRS, (long, "bad"), ("bad", long)]
        for text, row in zip(texts, encode(fast, texts)):
            parts = [p for p in text if p is not None]
            expected = hf(*parts, truncation=True, max_length=max_length)
            assert row["input_ids"] == expected["input_ids"], (text, max_length)
            assert row["token_type_ids"] == expected["token_type_ids"], (text, max_length)


def test_padding_matches_collate() -> None:
    from aclpipe.modeling.batching import collate

    rows = [{"input_ids": [2, 5, 3], "token_type_ids": [0, 0, 0], "label": 0},
            {"input_ids": [2, 3], "token_type_ids": [0, 0], "label": 0}]  # fmt: skip
    expected = collate(rows, pad_id=0, regression=False)
    got = pad(rows, pad_id=0)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(got[name], expected[name].numpy())


def test_input_formats_and_their_errors() -> None:
    assert list(records(["a\n", "\n", "b\tc\n"], "text")) == [
        ("a", ("a", None)), ("", None), ("b\tc", ("b", "c"))
    ]  # fmt: skip
    assert list(records(["idx\tsentence1\tsentence2\n", "1\ta\tb\n"], "tsv")) == [
        ("a\tb", ("a", "b"))
    ]
    assert list(records(['{"text": "a"}\n', '{"text_a": "a", "text_b": "b"}\n'], "jsonl")) == [
        ("a", ("a", None)), ("a\tb", ("a", "b"))
    ]  # fmt: skip
    with pytest.raises(UserError, match="input line 2 is not JSON"):
        list(records(['{"text": "a"}\n', "{oops\n"], "jsonl"))
    with pytest.raises(UserError, match='input line 1 has no "text"'):
        list(records(['{"sentence": "a"}\n'], "jsonl"))
    with pytest.raises(UserError, match="names no text column"):
        list(records(["id\tlabel\tscore\n", "1\t2\t3\n"], "tsv"))
    with pytest.raises(UserError, match="input line 3 has 3 tab-separated fields"):
        list(records(["sentence\tlabel\n", "a\t1\n", "a\tb\t1\n"], "tsv"))


def test_summary_of_an_empty_input_says_so(tmp_path) -> None:
    """No records in: the final line says so, with no nan throughput or layer."""
    from aclpipe.early_exit.predict import Predictor

    predictor = Predictor.__new__(Predictor)  # the summary reads only these fields
    predictor.count, predictor.seconds, predictor.layers, predictor.exits = 0, 0.0, [], [1, 2]
    predictor.engine_name, predictor.policy, predictor.threshold = "onnx", "entropy", 0.3
    predictor.setting_source = "given"
    line = predictor.summary()
    assert line.startswith("0 sentences: the input held no records") and "nan" not in line


@pytest.mark.slow
def test_predict_reads_export_json_once_and_checks_precision_once(
    export_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    from aclpipe.early_exit import onnx_runtime
    from aclpipe.early_exit import predict as predict_module

    reads, checks = [], []
    real_read_text, real_check = Path.read_text, onnx_runtime.check_precision

    def read_text(self, *args, **kwargs):
        reads.append(self.name)
        return real_read_text(self, *args, **kwargs)

    def check_precision(*args):
        checks.append(args[0])
        return real_check(*args)

    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(onnx_runtime, "check_precision", check_precision)
    monkeypatch.setattr(predict_module, "check_precision", check_precision)
    source = tmp_path / "in.txt"
    source.write_text("good\nbad plot .\n", encoding="utf-8")
    predictor = predict_module.predict_file(export_dir, str(source), str(tmp_path / "o.jsonl"))
    assert predictor.engine_name == "onnx" and predictor.count == 2
    assert reads.count("export.json") == 1 and checks == ["fp32"]
