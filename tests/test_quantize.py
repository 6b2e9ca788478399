"""Int8 segments (``export-exits --int8``, ``aclpipe.exits.quantize``): what is
quantized, the dev figures export.json records (against a plain loop over the sessions), the
runtime and ``predict --precision int8``.

Dynamic quantization picks each activation's scale from the whole batch, so an int8 answer
depends on the rows beside it (and, in the early-exit runtime, on who has left): the
references below run the same batches, or one row at a time where the runtime does too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_export import SENTENCES, trained_folders

from aclpipe.data.tasks import TASKS
from aclpipe.early_exit.onnx_runtime import OnnxEarlyExit
from aclpipe.early_exit.policies import exit_indices
from aclpipe.early_exit.predict import predict_lines
from aclpipe.early_exit.tokens import pad
from aclpipe.errors import UserError
from aclpipe.exits.export import export_exits
from aclpipe.exits.quantize import chain_logits, compare, int8_name
from aclpipe.layout import DEV_LOGITS, EMBEDDINGS_ONNX, EXPORT, EXPORT_JSON, split_file

BATCH = 4


@pytest.fixture(scope="module")
def int8_export(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict:
    root = tmp_path_factory.mktemp("int8")
    model_dir, data_dir = trained_folders(root, tiny_model_dir, "mean")
    out = root / EXPORT
    report = export_exits(TASKS["sst2"], model_dir, data_dir, out, batch_size=BATCH, int8=True)
    rows = [json.loads(line) for line in split_file(data_dir, "dev").read_text().splitlines()]
    return {"out": out, "report": report, "rows": rows, "root": root, "model_dir": model_dir,
            "data_dir": data_dir}  # fmt: skip


def test_int8_name() -> None:
    assert int8_name("segment_3.onnx") == "segment_3.int8.onnx"


@pytest.mark.slow
def test_every_weight_product_is_int8_and_nothing_else_changes(int8_export: dict) -> None:
    import onnx

    out, report = int8_export["out"], int8_export["report"]
    assert json.loads((out / EXPORT_JSON).read_text())["int8"] == report["int8"]
    assert report["int8"]["segments"] == [int8_name(s["file"]) for s in report["segments"]]
    for plain, int8 in zip(report["segments"], report["int8"]["segments"]):
        graph = onnx.load(str(out / int8)).graph
        weights = {init.name for init in graph.initializer}
        ops = [node.op_type for node in graph.node]
        assert ops.count("MatMulInteger") == 7  # Q, K, V, attention out, FFN in/out, the head
        for node in graph.node:  # the products left in float32 multiply two activations
            if node.op_type in ("MatMul", "Gemm"):
                assert not weights & set(node.input), node.name
        original = onnx.load(str(out / plain["file"])).graph
        assert [i.name for i in graph.input] == [i.name for i in original.input]
        assert [o.name for o in graph.output] == [o.name for o in original.output]


def _weight_products(graph) -> int:
    weights = {init.name for init in graph.initializer}
    return sum(
        node.op_type in ("MatMul", "Gemm") and bool(weights & set(node.input)) for node in graph.node
    )


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["cls", "layer-attention"])
def test_other_poolings_quantize_every_weight_product(pooling, tmp_path, tiny_model_dir):
    """cls pooling's dense layer and layer-attention's scorer are weight products too (and
    layer-attention's states carry every layer): each becomes MatMulInteger, and the int8
    chain runs and stays near the model."""
    import onnx

    model_dir, data_dir = trained_folders(tmp_path, tiny_model_dir, pooling)
    report = export_exits(TASKS["sst2"], model_dir, data_dir, tmp_path / EXPORT,
                          batch_size=BATCH, int8=True)  # fmt: skip
    for plain, int8 in zip(report["segments"], report["int8"]["segments"]):
        before = onnx.load(str(tmp_path / EXPORT / plain["file"])).graph
        after = onnx.load(str(tmp_path / EXPORT / int8)).graph
        assert _weight_products(after) == 0
        assert [n.op_type for n in after.node].count("MatMulInteger") == _weight_products(before) > 7
    assert max(report["int8"]["max_abs_diff_logits"]) < 0.05
    assert min(report["int8"]["label_agreement"]) >= 0.8


@pytest.mark.slow
def test_recorded_dev_figures_match_a_plain_loop(int8_export: dict) -> None:
    """score_int8, label_agreement and max_abs_diff_logits recomputed from the int8 sessions
    run by hand on the same length-sorted batches, against dev_logits.npz."""
    import onnxruntime as ort

    out, record, rows = int8_export["out"], int8_export["report"]["int8"], int8_export["rows"]
    sessions = [ort.InferenceSession(str(out / f)) for f in (EMBEDDINGS_ONNX, *record["segments"])]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    logits = np.zeros((len(record["exits"]), len(rows), 2), dtype=np.float32)
    for start in range(0, len(rows), BATCH):
        picked = order[start : start + BATCH]
        longest = max(len(rows[i]["input_ids"]) for i in picked)
        ids = np.zeros((len(picked), longest), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for r, i in enumerate(picked):
            n = len(rows[i]["input_ids"])
            ids[r, :n], mask[r, :n], types[r, :n] = rows[i]["input_ids"], 1, rows[i]["token_type_ids"]
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        (states,) = sessions[0].run(None, {i.name: feed[i.name] for i in sessions[0].get_inputs()})
        for e, session in enumerate(sessions[1:]):
            states, exit_logits = session.run(None, {"states": states, "attention_mask": mask})
            for r, i in enumerate(picked):
                logits[e, i] = exit_logits[r]
    reference = np.load(out / DEV_LOGITS)["logits"]
    labels = [row["label"] for row in rows]
    for e in range(len(record["exits"])):
        correct = sum(int(np.argmax(logits[e, i])) == labels[i] for i in range(len(rows)))
        assert record["score_int8"][e] == pytest.approx(correct / len(rows))
        same = sum(
            int(np.argmax(logits[e, i])) == int(np.argmax(reference[e, i])) for i in range(len(rows))
        )
        assert record["label_agreement"][e] == pytest.approx(same / len(rows))
        assert record["max_abs_diff_logits"][e] == pytest.approx(
            float(np.abs(logits[e] - reference[e]).max()), abs=1e-6
        )
        assert record["max_abs_diff_logits"][e] < 0.05  # int8, not noise: the tiny model's
        # logits are about 0.1-1 in size


def test_compare_by_hand() -> None:
    """Two exits, four rows: scores, agreement, gaps and the default setting, both precisions."""
    reference = np.array(
        [[[2.0, 0.0], [0.0, 2.0], [0.1, 0.0], [0.0, 0.3]],  # exit 1: confident on rows 0, 1
         [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]]],  # exit 2
        dtype=np.float32,
    )  # fmt: skip
    int8 = reference.copy()
    int8[0, 2] = [0.0, 0.1]  # row 2's label flips at exit 1 (still not confident there)
    int8[0, 0] = [0.2, 0.0]  # row 0 is no longer confident at exit 1: it runs to exit 2
    labels = np.array([0, 1, 1, 0])
    setting = {"policy": "confidence", "threshold": 0.8}
    got = compare(TASKS["sst2"], reference, int8, labels, [1, 2], setting)
    assert got["score"] == [0.5, 1.0] and got["score_int8"] == [0.75, 1.0]
    assert got["label_agreement"] == [0.75, 1.0]
    assert got["max_abs_diff_logits"] == pytest.approx([1.8, 0.0])
    at = got["default_setting"]
    # fp32: rows 0, 1 leave at exit 1 (right), rows 2, 3 run to exit 2 (right): 4/4, mean 1.5
    assert (at["score"], at["mean_exit_layer"]) == (1.0, 1.5)
    # int8: row 1 leaves at exit 1; rows 0, 2, 3 at exit 2: 4/4, mean 1.75
    assert (at["score_int8"], at["mean_exit_layer_int8"]) == (1.0, 1.75)
    full = compare(TASKS["sst2"], reference, int8, labels, [1, 2], {"policy": "none", "threshold": None})
    assert full["default_setting"]["score_int8"] == 1.0
    assert full["default_setting"]["mean_exit_layer_int8"] == 2.0


@pytest.mark.slow
def test_int8_runtime_matches_the_chain_row_by_row(int8_export: dict) -> None:
    """One row at a time no row leaves a batch, so the runtime's int8 exit and logits are
    the chain's (every policy at a middle threshold); policy none is the last exit."""
    out, rows = int8_export["out"], int8_export["rows"]
    chain = OnnxEarlyExit(out, "none", None, precision="int8")
    for policy, threshold in (("entropy", 0.68), ("confidence", 0.52), ("patience", 1)):
        runtime = OnnxEarlyExit(out, policy, threshold, precision="int8")
        for row in rows[:8]:
            all_exits = chain_logits(chain, [row], 0, 1)  # [E, 1, C]
            expected = int(exit_indices(policy, threshold, all_exits)[0])
            arrays = pad([row], 0)
            got = runtime(arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"])
            assert int(got.exit_index[0]) == expected
            np.testing.assert_array_equal(got.logits[0], all_exits[expected, 0])
    arrays = pad(rows[:5], 0)
    last = chain(arrays["input_ids"], arrays["attention_mask"], arrays["token_type_ids"])
    np.testing.assert_array_equal(last.logits, chain_logits(chain, rows[:5], 0, 5)[-1])


@pytest.mark.slow
def test_predict_precision_int8_and_its_errors(int8_export: dict, tmp_path: Path) -> None:
    out = int8_export["out"]
    rows = list(predict_lines(out, SENTENCES, "none", None, batch_size=1, engine="onnx"))
    from aclpipe.early_exit.predict import Predictor

    predictor = Predictor(out, "none", None, batch_size=1, precision="int8")
    int8_rows = list(predictor.records(SENTENCES))
    assert [r["text"] for r in int8_rows] == SENTENCES
    assert all(r["exit_layer"] == 3 for r in int8_rows)
    agree = sum(a["label"] == b["label"] for a, b in zip(rows, int8_rows))
    assert agree >= len(SENTENCES) - 1
    assert "engine onnx int8" in predictor.summary()
    with pytest.raises(UserError, match="--precision int8 runs on the onnx engine only"):
        Predictor(out, precision="int8", engine="torch")
    with pytest.raises(UserError, match="unknown precision 'int4': use fp32 or int8"):
        Predictor(out, precision="int4")
    plain = tmp_path / "plain"
    export_exits(TASKS["sst2"], int8_export["model_dir"], int8_export["data_dir"], plain, batch_size=BATCH)
    assert "int8" not in json.loads((plain / EXPORT_JSON).read_text())
    assert not list(plain.glob("*.int8.onnx"))
    with pytest.raises(UserError, match="needs an export folder with int8 segments .* has none"):
        Predictor(plain, precision="int8")
    with pytest.raises(UserError, match="has none: export with --int8"):
        OnnxEarlyExit(plain, "none", None, precision="int8")


@pytest.mark.slow
def test_graphs_listed_but_missing_are_named(int8_export: dict, tmp_path: Path) -> None:
    """An export copied without its int8 files (or a segment): one line, not ONNX Runtime's
    NO_SUCHFILE."""
    import shutil

    from aclpipe.early_exit.predict import Predictor

    copy = tmp_path / "copy"
    shutil.copytree(int8_export["out"], copy)
    (copy / "segment_2.int8.onnx").unlink()
    with pytest.raises(UserError, match=r"has no int8 segments \(segment_2\.int8\.onnx is "
                       r"missing, though export.json lists it\): make them with `aclpipe "
                       r"export-exits --task sst2 --method <method> --int8`"):  # fmt: skip
        Predictor(copy, precision="int8")
    OnnxEarlyExit(copy, "none", None)  # fp32 needs none of them
    (copy / "segment_3.onnx").unlink()
    with pytest.raises(UserError, match=r"segment_3\.onnx is missing, though export.json lists "
                       r"it: run `aclpipe export-exits` again"):  # fmt: skip
        OnnxEarlyExit(copy, "none", None)


def test_compare_for_a_regression_task() -> None:
    """STS-B: one output per exit, no label agreement; patience with eps on the outputs."""
    reference = np.array([[[1.0], [2.0], [3.0], [4.0]], [[1.05], [2.5], [2.95], [4.5]]], dtype=np.float32)
    int8 = reference + np.float32(0.01)
    labels = np.array([1.0, 2.0, 3.0, 4.0])
    setting = {"policy": "patience", "threshold": 1}
    got = compare(TASKS["stsb"], reference, int8, labels, [3, 6], setting)
    assert "label_agreement" not in got
    assert got["max_abs_diff_logits"] == pytest.approx([0.01, 0.01], abs=1e-6)
    assert got["score"][0] == pytest.approx(1.0)  # exit 1 is the labels exactly
    assert got["score_int8"][0] == pytest.approx(1.0)  # a shift keeps both correlations
    at = got["default_setting"]  # the last exit answers every row: 6 layers either way
    assert at["mean_exit_layer"] == at["mean_exit_layer_int8"] == 6.0
    assert at["score"] == pytest.approx(got["score"][1])
