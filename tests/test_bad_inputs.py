"""A catalogue of bad inputs, each through the command line, each with the same contract.

For every case in ``CASES`` the command exits with code 2 and prints exactly one line, on
stderr, starting with ``error:`` and matching the case's pattern; no traceback; nothing new
on disk (no output folder or file, no temporary); every earlier output byte-identical.
docs/bad_inputs.md shows each case as the user sees it, with the fix.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import yaml
from cli_helpers import invoke, tree
from paths import RELATIVE, at

from aclpipe.data.tasks import get_task
from aclpipe.layout import MODEL_CONFIG, PARAMS, TOKENIZER, WEIGHTS

DOCS = Path(__file__).resolve().parents[1] / "docs" / "bad_inputs.md"
Arrange = Callable[[Path], list[str]]  # makes the bad input in the project; returns the command


class Case(NamedTuple):
    name: str
    problem: str  # what is wrong, in the words of docs/bad_inputs.md
    pattern: str  # a regular expression the one error line must match (after "error: ")
    arrange: Arrange


# How each case makes its bad input ----------------------------------------------------------


def command(*args: str) -> Arrange:
    return lambda work: list(args)


def _glue_copy(work: Path, folder: str) -> Path:
    """A copy of the tiny GLUE folder ``folder`` under ``work/glue-bad`` to spoil."""
    source = Path(yaml.safe_load((work / PARAMS).read_text())["data"]["glue_dir"])
    shutil.copytree(source / folder, work / "glue-bad" / folder)
    return work / "glue-bad" / folder


def tsv(
    file: str, spoil: Callable[[bytes], bytes] | None, folder: str = "SST-2", task: str = "sst2"
) -> Arrange:
    """prepare from a GLUE folder whose ``file`` was changed by ``spoil`` (None: deleted)."""

    def arrange(work: Path) -> list[str]:
        path = _glue_copy(work, folder) / file
        if spoil is None:
            path.unlink()
        else:
            path.write_bytes(spoil(path.read_bytes()))
        return ["prepare", "--task", task, "--glue-dir", "glue-bad"]

    return arrange


def params(edit: Callable[[dict], None], *args: str) -> Arrange:
    """``args`` with params.yaml changed by ``edit``."""

    def arrange(work: Path) -> list[str]:
        raw = yaml.safe_load((work / PARAMS).read_text())
        edit(raw)
        (work / PARAMS).write_text(yaml.safe_dump(raw), encoding="utf-8")
        return list(args)

    return arrange


def params_text(text: bytes, *args: str) -> Arrange:
    def arrange(work: Path) -> list[str]:
        (work / PARAMS).write_bytes(text)
        return list(args)

    return arrange


def setting(section: str, key: str, value) -> Callable[[dict], None]:
    return lambda raw: raw.setdefault(section, {}).__setitem__(key, value)


def edit(section: str, key: str, value, args: tuple[str, ...] = ()) -> Arrange:
    """``args`` (default: finetune ce) with ``section.key: value`` in params.yaml."""
    return params(setting(section, key, value), *(args or FINETUNE_CE))


def sets(*items: str, args: tuple[str, ...] = ()) -> Arrange:
    """``args`` (default: finetune ce) with ``--set item`` for each item."""
    return command(*(args or FINETUNE_CE), *(a for item in items for a in ("--set", item)))


def spoil_model(file: str, spoil: Callable[[bytes], bytes]) -> Arrange:
    def arrange(work: Path) -> list[str]:
        path = at(work).model("sst2", "ce") / file
        path.write_bytes(spoil(path.read_bytes()))
        return ["evaluate", "--task", "sst2", "--method", "ce"]

    return arrange


def predict_bytes(data: bytes, *options: str) -> Arrange:
    """predict with the trained ce model on a file holding ``data`` as it is, into out.jsonl."""

    def arrange(work: Path) -> list[str]:
        (work / "in.txt").write_bytes(data)
        model = ["--model", "models/sst2/ce"]
        return ["predict", *model, "--input", "in.txt", "--output", "out.jsonl", *options]

    return arrange


def predict_tsv(text: str, task: str, name: str = "in.tsv") -> Arrange:
    """predict on ``name`` (in.tsv) holding ``text`` with a copy of the ce model that says it
    was trained on ``task`` (``aclpipe_task.json``, as an export's model/ folder carries it)."""

    def arrange(work: Path) -> list[str]:
        served = work / "served"
        shutil.copytree(work / "models" / "sst2" / "ce", served)
        record = {"task": task, "labels": ["0", "1"]}
        (served / "aclpipe_task.json").write_text(json.dumps(record), encoding="utf-8")
        (work / name).write_text(text, encoding="utf-8")
        return ["predict", "--model", "served", "--input", name, "--output", "out.jsonl"]

    return arrange


def int8_files_missing(work: Path) -> list[str]:
    """An export made with --int8 whose int8 segments did not come along (copied without
    them): export.json lists files that are not there."""
    result = invoke("export-exits", "--task", "sst2", "--method", "ce", "--int8")
    assert result.exit_code == 0, result.output
    export = work / "models" / "sst2" / "ce" / "export"
    for path in export.glob("*.int8.onnx"):
        path.unlink()
    (work / "in.txt").write_text("good .\n", encoding="utf-8")
    model = ["--model", str(export.relative_to(work))]
    return ["predict", *model, "--input", "in.txt", "--output", "out.jsonl", "--precision", "int8"]


def policy(name: str, threshold: str | None = None) -> Arrange:
    """predict one sentence with exit policy ``name`` (and ``threshold``)."""
    return predict("good .\n", "--policy", name, *(("--threshold", threshold) if threshold else ()))


def predict(lines: str, *options: str) -> Arrange:
    """predict with the trained ce model on a file holding ``lines``, into out.jsonl."""

    def arrange(work: Path) -> list[str]:
        (work / "in.txt").write_text(lines, encoding="utf-8")
        model = ["--model", RELATIVE.model("sst2", "ce").as_posix()]
        return ["predict", *model, "--input", "in.txt", "--output", "out.jsonl", *options]

    return arrange


def predict_to(output: str, make: str | None = None) -> Arrange:
    """predict one sentence with the trained ce model into ``output`` (a folder first made
    there when ``make`` says so)."""

    def arrange(work: Path) -> list[str]:
        (work / "in.txt").write_text("good .\n", encoding="utf-8")
        if make == "folder":
            (work / output).mkdir()
        model = ["--model", RELATIVE.model("sst2", "ce").as_posix()]
        return ["predict", *model, "--input", "in.txt", "--output", output]

    return arrange


def other_model(work: Path) -> list[str]:
    """A copy of the tiny model under another name: data/sst2 was tokenized for the first."""
    source = Path(yaml.safe_load((work / PARAMS).read_text())["model"]["name"])
    shutil.copytree(source, work / "other-model")
    return ["finetune", "--task", "sst2", "--method", "ce", "--set", "model.name=other-model"]


def empty_model_folder(work: Path) -> list[str]:
    (work / "empty-model").mkdir()
    return ["prepare", "--task", "sst2", "--set", "model.name=empty-model"]


def regression_task(work: Path) -> list[str]:
    assert invoke("prepare", "--task", "stsb").exit_code == 0
    return ["finetune", "--task", "stsb", "--method", "scl"]


def trained_as(task: str, method: str, exits: list[int], pooling: str, *args: str) -> Arrange:
    """export-hf ``args`` after a model of the tiny encoder with ``exits`` and ``pooling`` was
    saved as finetune leaves one, as ``models/<task>/<method>``."""

    def arrange(work: Path) -> list[str]:
        from aclpipe.modeling.backbone import load_encoder, load_tokenizer
        from aclpipe.modeling.model import ExitSpec, MultiExitModel

        source = yaml.safe_load((work / PARAMS).read_text())["model"]["name"]
        labels = 1 if get_task(task).embeds else 2
        spec = ExitSpec(labels, exits, pooling, dropout=0.1)
        folder = at(work).model(task, method)
        MultiExitModel(load_encoder(source), spec).save(folder, base_model=source)
        load_tokenizer(source).save_pretrained(str(folder / TOKENIZER))
        return ["export-hf", "--task", task, "--method", method, *args]

    return arrange


def export_hf_to(out: str, file: str | None = None, folder: str | None = None) -> Arrange:
    """export-hf of the trained ce model into ``out``, after a file was put at ``file`` or a
    folder holding one at ``folder``."""

    def arrange(work: Path) -> list[str]:
        if folder is not None:
            (work / folder).mkdir()
            (work / folder / "notes.txt").write_text("notes\n", encoding="utf-8")
        if file is not None:
            (work / file).write_text("notes\n", encoding="utf-8")
        return [*stage("export-hf"), "--out", out]

    return arrange


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _append(line: str) -> Callable[[bytes], bytes]:
    return lambda data: data + line.encode("utf-8")


def _blow_up(lr: str) -> Arrange:
    """Learning rates that make the weights overflow (no clipping, every step at full size)."""
    return sets("train.max_grad_norm=0", "train.log_every=1000", f"train.lr={lr}",
                f"train.head_lr={lr}", args=FINETUNE_JOINT)  # fmt: skip


def stage(name: str = "finetune", task: str = "sst2", method: str = "ce") -> tuple[str, ...]:
    return (name, "--task", task, "--method", method)


FINETUNE_CE, FINETUNE_JOINT = stage(), stage(method="joint")
PREPARE = ("prepare", "--task", "sst2")
_NOT_FOUND = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")

CASES: list[Case] = [
    # GLUE files
    Case("tsv-missing-column", "a GLUE TSV without the label column in its header",
         r"dev\.tsv, line 1: missing column 'label' in the header",
         tsv("dev.tsv", lambda d: d.replace(b"sentence\tlabel", b"sentence\tsentiment", 1))),
    Case("tsv-ragged-row", "a row with an extra tab-separated field",
         r"dev\.tsv, line 18: 3 tab-separated fields, expected 2",
         tsv("dev.tsv", _append("the movie was\tgood\t1\n"))),
    Case("tsv-unknown-label", "a label outside the task's labels",
         r"dev\.tsv, line 18: unknown label 'maybe'; valid labels for sst2: 0, 1",
         tsv("dev.tsv", _append("the movie was fine \tmaybe\n"))),
    Case("tsv-empty-file", "an empty train.tsv",
         r"train\.tsv, line 1: empty file, no header and no data rows",
         tsv("train.tsv", lambda d: b"")),
    Case("tsv-header-only", "a train.tsv with a header and no rows",
         r"train\.tsv, line 2: no data rows in the train split",
         tsv("train.tsv", lambda d: b"sentence\tlabel\n")),
    Case("tsv-binary", "binary junk instead of text",
         r"train\.tsv, line 1: binary content \(NUL byte\)",
         tsv("train.tsv", lambda d: bytes(range(256)) * 4)),
    Case("tsv-not-utf8", "a TSV saved as Latin-1",
         r"dev\.tsv, line 18: not valid UTF-8",
         tsv("dev.tsv", lambda d: d + "un film très bon \t1\n".encode("latin-1"))),
    Case("tsv-score-not-a-number", "an STS-B score that is not a number",
         r"dev\.tsv, line 10: score 'high' is not a number",
         tsv("dev.tsv", _append("9\tmain\tx\t2012\t0009\tnone\tnone\ta b\tc d\thigh\n"),
             folder="STS-B", task="stsb")),
    Case("glue-file-missing", "dev.tsv missing, and the hub not reachable offline",
         r"glue-bad/SST-2/dev\.tsv.*HF_HUB_OFFLINE\S* is set", tsv("dev.tsv", None)),
    # models
    Case("model-not-trained", "evaluate a method that was never trained",
         r"no trained model in models/sst2/joint \(missing aclpipe_model\.json",
         command(*stage("evaluate", method="joint"))),
    Case("model-truncated", "a truncated model.safetensors",
         r"model in models/sst2/ce is damaged or truncated \(SafetensorError\)",
         spoil_model(WEIGHTS, _truncate)),
    Case("model-config-damaged", "a damaged aclpipe_model.json",
         r"model in models/sst2/ce is damaged or truncated \(JSONDecodeError\)",
         spoil_model(MODEL_CONFIG, _truncate)),
    Case("export-not-trained", "export a method that was never trained",
         r"no trained model in models/sst2/joint", command(*stage("export-exits", method="joint"))),
    Case("model-id-offline", "a hub model id while offline",
         r"model 'aclpipe-tests/no-such-model' is neither a local folder nor reachable .*HF_HUB_OFFLINE=1",
         sets("model.name=aclpipe-tests/no-such-model", args=PREPARE)),
    Case("model-folder-missing", "model.name is a path that does not exist",
         r"model folder \./no-model not found", sets("model.name=./no-model", args=PREPARE)),
    Case("model-folder-without-config", "model.name is a folder without config.json",
         r"model folder empty-model has no config\.json", empty_model_folder),
    Case("data-for-another-model", "data prepared with another model.name",
         r"data/sst2 was tokenized for '.*' but model\.name is 'other-model'", other_model),
    Case("data-not-prepared", "finetune before prepare",
         r"data/mrpc/meta\.json not found: run `aclpipe prepare --task mrpc` first",
         command(*stage(task="mrpc"))),
    # params.yaml and --set
    Case("params-unknown-key", "a misspelt key in params.yaml",
         r"unknown key train\.learning_rate: valid keys of train are",
         edit("train", "learning_rate", 1e-3)),
    Case("params-unknown-section", "a section params.yaml does not have",
         r"unknown section 'training' in params", params(lambda r: r.update(training={}), *FINETUNE_CE)),
    Case("params-wrong-type", "a word where a number belongs",
         r"train\.epochs must be int, got 'three' \(str\)",
         edit("train", "epochs", "three")),
    Case("params-negative-lr", "a negative learning rate",
         r"train\.lr must be > 0, got -1e-05", edit("train", "lr", -1e-5)),
    Case("params-batch-size-zero", "batch size 0",
         r"train\.batch_size must be > 0, got 0", sets("train.batch_size=0")),
    Case("params-exits-out-of-range", "model.exits beyond the encoder's layers",
         r"model\.exits \[1, 7\] must be layers in 1\.\.3 \(this encoder has 3 layers\)",
         edit("model", "exits", [1, 7], FINETUNE_JOINT)),
    Case("params-exits-empty", "model.exits an empty list", r"model\.exits is empty",
         edit("model", "exits", [], FINETUNE_JOINT)),
    Case("params-too-few-exits", "one exit for a multi-exit method",
         r"method joint needs at least two exits but model\.exits is \[3\]",
         edit("model", "exits", [3], FINETUNE_JOINT)),
    Case("params-unknown-pooling", "an unknown pooling",
         r"model\.pooling is 'max': use one of auto, cls, mean, layer-attention",
         sets("model.pooling=max")),
    Case("params-dropout-out-of-range", "dropout above 1",
         r"model\.dropout must be in \[0, 1\], got 1\.5", sets("model.dropout=1.5")),
    Case("params-angle-out-of-range", "an ACL-Grad angle above 180 degrees",
         r"methods\.acl\.max_angle must be in \[0, 180\] degrees",
         sets("methods.acl.max_angle=200", args=stage(method="acl"))),
    Case("params-foreign-knob", "a knob of another method (ce has no ACL-Grad)",
         r"^unknown key methods\.ce\.max_angle: methods\.ce takes no keys",
         sets("methods.ce.max_angle=45")),
    Case("params-unknown-knob", "a knob that the method does not read",
         r"^unknown key methods\.joint\.tau: valid keys of methods\.joint are weights$",
         sets("methods.joint.tau=0.2", args=FINETUNE_JOINT)),
    Case("params-unknown-pipeline-task", "pipeline.tasks names an unknown task",
         r"pipeline\.tasks has unknown 'sst5'",
         edit("pipeline", "tasks", ["sst2", "sst5"], ("prepare",))),
    Case("params-invalid-yaml", "params.yaml that is not valid YAML",
         r"params\.yaml is not valid YAML at line 2", params_text(b"train:\n\tlr: 1\n", *FINETUNE_CE)),
    Case("params-not-utf8", "params.yaml saved as Latin-1",
         r"params\.yaml is not UTF-8 text", params_text("train: {}\n# caf\xe9\n".encode("latin-1"), *FINETUNE_CE)),
    Case("params-file-missing", "--params names a missing file",
         r"params file nope\.yaml not found", command(*FINETUNE_CE, "--params", "nope.yaml")),
    Case("set-without-value", "--set without =value", r"--set 'train\.lr' is not key=value",
         sets("train.lr")),
    Case("params-padding-free-choice", "train.padding_free that is not auto, true or false",
         r"train\.padding_free is 'maybe': use one of auto, true, false$", sets("train.padding_free=maybe")),
    Case("device-cuda-without-gpu", "train.device=cuda on a machine without a GPU",
         r"train\.device is cuda but no GPU is visible", sets("train.device=cuda")),
    # selectors
    Case("unknown-task", "a task that GLUE does not have", r"unknown task 'sst3': use one of cola, sst2",
         command(*stage(task="sst3"))),
    Case("unknown-method", "a method aclpipe does not have", r"unknown method 'acl_cl': use one of ce, scl",
         command(*stage(method="acl_cl"))),
    Case("contrastive-on-regression", "a contrastive method on STS-B (regression)",
         r"contrastive methods need class labels; STS-B is regression", regression_task),
    Case("tradeoff-without-results", "tradeoff for a task with no evaluated method",
         r"no results for task mrpc under reports/mrpc", command("tradeoff", "--task", "mrpc")),
    # predict
    Case("predict-unknown-policy", "an exit policy that does not exist",
         r"unknown policy 'fastest': use one of entropy, patience, confidence", policy("fastest")),
    Case("predict-entropy-out-of-range", "an entropy threshold above log C",
         r"entropy threshold 5\.0 is outside \[0, log C\] = \[0, 0\.693\]",
         policy("entropy", "5")),
    Case("predict-confidence-out-of-range", "a confidence threshold above 1",
         r"confidence threshold 1\.5 is outside \[0, 1\]",
         policy("confidence", "1.5")),
    Case("predict-patience-fraction", "a patience that is not a whole number",
         r"patience 0\.5 must be a whole number >= 1", policy("patience", "0.5")),
    Case("predict-input-missing", "--input names a missing file", r"input file nope\.txt not found",
         command("predict", "--model", RELATIVE.model("sst2", "ce").as_posix(), "--input", "nope.txt", "--output", "out.jsonl")),
    Case("predict-line-with-two-tabs", "an input line with two tabs",
         r"input line 2 has 2 tabs: give one sentence per line, or two sentences separated by one tab",
         predict("good .\na\tb\tc\n")),
    Case("predict-model-missing", "--model names a folder without a model",
         r"no trained model in models/sst2/nothing",
         command("predict", "--model", RELATIVE.model("sst2", "nothing").as_posix(), "--input", "-")),
    Case("predict-onnx-without-export", "--engine onnx on a model folder (no export.json)",
         r"--engine onnx needs the folder `aclpipe export-exits` writes \(models/<task>/<method>/export\), "
         r"with export.json; models/sst2/ce has none: give that folder, or use --engine torch",
         predict("good .\n", "--engine", "onnx")),
    Case("predict-int8-without-export", "--precision int8 on a model folder (no int8 segments)",
         r"--precision int8 needs an export folder with int8 segments \(`aclpipe export-exits --int8` "
         r"writes models/<task>/<method>/export\); models/sst2/ce has none: export with --int8 and "
         r"give that folder, or use --precision fp32",
         predict("good .\n", "--precision", "int8")),
    Case("predict-int8-segments-missing", "--precision int8 on an export whose int8 files are gone",
         r"the export in models/sst2/ce/export has no int8 segments \(segment_3\.int8\.onnx is "
         r"missing, though export\.json lists it\): make them with `aclpipe export-exits --task "
         r"sst2 --method <method> --int8`, or use --precision fp32",
         int8_files_missing),
    Case("predict-unknown-precision", "a precision that does not exist",
         r"unknown precision 'fp16': use fp32 or int8",
         predict("good .\n", "--precision", "fp16")),
    Case("predict-not-utf8", "an input file in Latin-1, not UTF-8",
         r"in\.txt line 2 is not UTF-8 text \(byte 0xe9 at column 4\): convert it, e\.g\. "
         r"`iconv -f latin1 -t utf-8 in\.txt > fixed\.txt` for a Latin-1 file, and give that; a "
         r"binary file will not do",
         predict_bytes(b"good .\ncaf\xe9 au lait\n")),
    Case("predict-binary-file", "a binary file given as input",
         r"in\.txt line 1 holds a NUL byte, so it is a binary file, not text: give a UTF-8 text, "
         r"TSV or JSONL file",
         predict_bytes(b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00\xff\xfe")),
    Case("predict-tsv-pair-to-one-text-model", "a TSV of sentence pairs given to a one-text (SST-2) model",
         r"the TSV header \(sentence1 \| sentence2\) names two texts, but this model \(sst2\) reads "
         r"one: keep one text column \(sentence\), or give a model of a sentence-pair task",
         predict_tsv("sentence1\tsentence2\na man plays .\ta man plays music .\n", "sst2")),
    Case("predict-tsv-one-text-to-pair-model", "a TSV of single sentences given to a pair (MRPC) model",
         r"the TSV header \(sentence \| label\) names one text, but this model \(mrpc\) reads "
         r"sentence pairs: name the two text columns sentence1 and sentence2, or give a model of a "
         r"one-text task",
         predict_tsv("sentence\tlabel\ngood .\t1\n", "mrpc")),
    Case("predict-jsonl-pair-to-one-text-model", "a JSONL pair record given to a one-text (SST-2) model",
         r"input line 2 holds two texts, but this model \(sst2\) reads one: send one text per "
         r"record, or give a model of a sentence-pair task",
         predict_tsv('{"text": "good ."}\n{"text_a": "a man plays .", "text_b": "he plays ."}\n',
                     "sst2", "in.jsonl")),
    Case("predict-text-one-text-to-pair-model", "a line with no tab given to a pair (MRPC) model",
         r"input line 1 holds one text, but this model \(mrpc\) reads sentence pairs: send "
         r"\{\"text_a\": \.\.\., \"text_b\": \.\.\.\} \(or two tab-separated texts\), or give a "
         r"model of a one-text task",
         predict_tsv("a man plays .\n", "mrpc", "in.txt")),
    Case("predict-jsonl-not-json", "a JSONL input line that is not JSON",
         r"input line 2 is not JSON \(Expecting property name enclosed in double quotes\): write one "
         r"object per line, such as \{\"text\": \"...\"\}",
         predict('{"text": "good ."}\n{oops\n', "--format", "jsonl")),
    Case("predict-output-folder", "--output names a folder",
         r"--output out is a folder: give a file path, such as out/predictions\.jsonl",
         predict_to("out", make="folder")),
    Case("predict-output-not-writable", "--output in a folder that cannot be made (a file "
         "stands in its place)",
         r"--output in\.txt/out\.jsonl cannot be written: in\.txt is a file, not a folder; give "
         r"a path in a folder",
         predict_to("in.txt/out.jsonl")),
    # export-hf
    Case("export-hf-unknown-method", "export-hf of a method aclpipe does not have",
         r"unknown method 'acl_cl': use one of ce, scl", command(*stage("export-hf", method="acl_cl"))),
    Case("export-hf-not-trained", "export-hf of a method that was never trained",
         r"no trained model in models/sst2/joint \(missing aclpipe_model\.json",
         command(*stage("export-hf", method="joint"))),
    Case("export-hf-plain-mean-pooling", "--plain for a model pooled by mean",
         r"--plain writes a stock BertForSequenceClassification, which cannot hold mean pooling "
         r"\(the stock class pools \[CLS\] through its pooler\): drop --plain",
         trained_as("sst2", "scl", [3], "mean", "--plain")),
    Case("export-hf-plain-multi-exit", "--plain for a multi-exit model",
         r"--plain writes a stock BertForSequenceClassification, which cannot hold 3 exits at "
         r"layers \[1, 2, 3\] \(the stock class has one, on top\): drop --plain",
         trained_as("sst2", "joint", [1, 2, 3], "cls", "--plain")),
    Case("export-hf-plain-sentence-embeddings", "--plain for a sentence-embedding method",
         r"--plain writes a stock classifier, and sentences is a sentence-embedding task: drop "
         r"--plain", command(*stage("export-hf", task="sentences", method="simcse-unsup"), "--plain")),
    Case("export-hf-layer-attention-sentence-transformers",
         "a sentence-embedding model pooled by layer attention",
         r"layer-attention pooling has no sentence-transformers module: export-hf writes "
         r"sentence-transformers folders for mean and cls pooling",
         trained_as("sentences", "simcse-unsup", [3], "layer-attention")),
    Case("export-hf-out-is-a-file", "--out names a file", r"in\.txt is a file, and export-hf "
         r"writes a folder: give --out a new folder's path", export_hf_to("in.txt", file="in.txt")),
    Case("export-hf-out-foreign-folder", "--out names a folder export-hf did not write",
         r"notes is a folder export-hf did not write, and export-hf replaces its folder whole: "
         r"give --out a new folder's path", export_hf_to("notes", folder="notes")),
    Case("export-hf-out-is-the-model", "--out names the trained model's own folder",
         r"models/sst2/ce is a folder export-hf did not write",
         export_hf_to(RELATIVE.model("sst2", "ce").as_posix())),
    Case("export-hf-out-not-writable", "--out in a folder that cannot be made (a file stands "
         "in its place)", r"--out in\.txt/hf cannot be written: in\.txt is a file, not a folder; "
         r"give a path in a folder", export_hf_to("in.txt/hf", file="in.txt")),
    Case("export-hf-out-several-models", "--out with more than one method",
         r"--out names one folder but 2 task/method pairs were chosen",
         command(*stage("export-hf", method="ce,joint"), "--out", "hf")),
    # training
    Case("nan-loss", "a learning rate so high that the loss becomes NaN",
         r"loss is nan at step 2 \(stage 1, epoch 1\): the learning rate is likely too high",
         _blow_up("1e30")),
    Case("lr-overflow", "a learning rate that overflows float32 in the optimizer step",
         r"train\.lr", _blow_up("1e38")),
]  # fmt: skip
_MARKS = {
    "device-cuda-without-gpu": _NOT_FOUND,
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, make_project) -> Path:
    """A project with SST-2 prepared, ce trained and evaluated: the earlier outputs."""
    work = make_project(tmp_path_factory.mktemp("trained"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.delenv("GLUE_DIR", raising=False)
        for stage in ("finetune", "evaluate"):
            result = invoke(stage, "--task", "sst2", "--method", "ce")
            assert result.exit_code == 0, result.output
    return work


@pytest.fixture
def work(trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "work"
    shutil.copytree(trained, folder)
    monkeypatch.chdir(folder)
    monkeypatch.delenv("GLUE_DIR", raising=False)
    return folder


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.name, marks=_MARKS.get(c.name, ())) for c in CASES]
)
def test_bad_input(case: Case, work: Path) -> None:
    args = case.arrange(work)
    before = tree(work)
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == "", result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(case.pattern, lines[0].removeprefix("error: ")), lines[0]
    assert tree(work) == before  # nothing new, nothing changed


def test_at_least_twenty_distinct_cases() -> None:
    names = [c.name for c in CASES]
    assert len(names) >= 20 and len(set(names)) == len(names)


def test_docs_show_every_case() -> None:
    """docs/bad_inputs.md has one table row per case, in the same order, with its problem."""
    rows = [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        for line in DOCS.read_text(encoding="utf-8").split("\n## The server")[0].splitlines()
        if line.startswith("| `")
    ]  # the server's rows (after "## The server") are test_serve_api.py's
    assert [row[0].strip("`") for row in rows] == [c.name for c in CASES]
    for row, case in zip(rows, CASES):
        assert case.problem in row[1], (case.name, row[1])
        assert len(row) == 4 and all(row), row  # case, input, what the user sees, the fix


def test_debug_shows_the_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same error with --debug: Python's traceback, ending in the UserError (in a real
    process, as a user sees it; tradeoff imports nothing heavy before reading params)."""
    message = "params file nope.yaml not found: pass an existing file with --params"
    monkeypatch.chdir(tmp_path)
    plain = invoke("tradeoff", "--params", "nope.yaml")
    assert plain.exit_code == 2 and plain.stderr == f"error: {message}\n"
    debug = subprocess.run(
        [sys.executable, "-m", "aclpipe.cli", "--debug", "tradeoff", "--params", "nope.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert debug.returncode == 1 and debug.stdout == ""
    assert debug.stderr.startswith("Traceback (most recent call last):")
    assert debug.stderr.rstrip().endswith(f"aclpipe.errors.UserError: {message}")
    assert list(tmp_path.iterdir()) == []
