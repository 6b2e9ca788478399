"""Export: a trained multi-exit model as files a serving system can load alone.

``export_exits`` writes, atomically, into ``models/<task>/<method>/export/``:

- ``embeddings.onnx`` and ``segment_<k>.onnx`` per exit ``k``: the model cut into graphs an
  early-exit runtime chains (``aclpipe.exits.segments``; ``early_exit.onnx_runtime`` runs
  them). ``embeddings.onnx``: ``input_ids``, ``attention_mask`` (and ``token_type_ids`` when
  the tokenizer makes them and the embeddings read them), ``[batch, sequence]`` int64 ->
  ``states``; segment ``k``: ``states``, ``attention_mask`` -> ``states``, ``logits [batch,
  C]``. Every graph and the chain are checked with onnxruntime against PyTorch on real dev
  rows; the export fails above the tolerance;
- ``tokenizer.json`` (the fast tokenizer file, read with the ``tokenizers`` library);
- ``model/``: ``model.safetensors`` + ``aclpipe_model.json`` (``MultiExitModel.save``), the
  tokenizer files and ``aclpipe_task.json`` (task name and label names), so that
  ``load_multi_exit(out/"model")`` works without the training folder (``predict --engine
  torch``);
- ``dev_logits.npz``: logits at every exit on the dev split(s). Keys: ``exits [E]``,
  ``splits`` (dev split names), ``logits [E, N, C]`` and ``labels [N]`` for the task's first
  dev split, and ``logits_<split>`` / ``labels_<split>`` for every further one (MNLI:
  ``logits`` is dev_matched, ``logits_dev_mismatched`` the mismatched split);
- ``export.json``: task, label names, exits, pooling, the graphs with their max abs
  differences (per graph and for the chain), the tolerance, the default exit setting
  (``aclpipe.early_exit.settings``), opset, versions;
- with ``int8``: ``segment_<k>.int8.onnx`` per exit (``aclpipe.exits.quantize``) and,
  in export.json under ``int8``, what they score on dev against the model.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from aclpipe import atomic
from aclpipe.data.prepared import load_split
from aclpipe.data.tasks import Task
from aclpipe.early_exit.policies import NO_EXIT
from aclpipe.early_exit.settings import choose_default, fallback
from aclpipe.errors import UserError
from aclpipe.evaluation.scoring import all_exit_logits, split_labels
from aclpipe.exits.segments import write_segments
from aclpipe.layout import DEV_LOGITS, EXPORT_JSON, EXPORT_MODEL, EXPORT_TOKENIZER, TASK_FILE
from aclpipe.modeling.backbone import load_tokenizer_from
from aclpipe.modeling.batching import collate
from aclpipe.modeling.model import MultiExitModel, load_multi_exit

PARITY_ROWS = 6  # rows of spread lengths in the parity batch (plus one row on its own)


def uses_token_types(model: MultiExitModel, tokenizer) -> bool:
    """True when the tokenizer makes ``token_type_ids`` and the embeddings take them."""
    return "token_type_ids" in tokenizer.model_input_names and takes_token_types(model)


def takes_token_types(model: MultiExitModel) -> bool:
    import inspect

    return "token_type_ids" in inspect.signature(model.encoder.embeddings.forward).parameters


def save_model_folder(model: MultiExitModel, tokenizer, folder: Path, task: Task) -> None:
    """Weights, model config, tokenizer and label names: everything ``predict`` needs."""
    model.save(folder)
    tokenizer.save_pretrained(str(folder))
    record = {"task": task.name, "labels": list(task.labels)}
    (folder / TASK_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def parity_batches(rows: list[dict], pad_id: int, names: list[str]) -> list[dict]:
    """Right-padded batches of real rows: ``PARITY_ROWS`` of spread lengths, then one alone.

    The first batch (shortest to longest, at least two rows) is also the export's example
    input, so neither dynamic axis is specialised to 1.
    """
    if not rows:
        raise UserError("the dev split is empty: run `aclpipe prepare` with some dev examples")
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    picks = np.linspace(0, len(order) - 1, num=min(PARITY_ROWS, len(order))).round()
    chosen = [rows[order[int(p)]] for p in picks]
    if len(chosen) < 2:
        chosen = chosen * 2
    single = [rows[order[len(order) // 2]]]
    batches = []
    for group in (chosen, single):
        batch = collate(group, pad_id, regression=False)
        if "token_type_ids" in names and "token_type_ids" not in batch:
            batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
        batches.append({name: batch[name] for name in names})  # each [b, T] int64
    return batches


def write_timing_segments(
    model: MultiExitModel, rows: list[dict], pad_id: int, regression: bool, folder: Path
) -> None:
    """The segments alone, checked against PyTorch on ``rows`` as ``export_exits`` checks
    them, and an ``export.json`` with what ``OnnxEarlyExit`` reads, into ``folder``.

    For evaluate's sweep, which times the ONNX Runtime engine before ``export-exits`` runs
    (the export reads the sweep's curves.json). The graphs take ``token_type_ids`` when the
    rows carry them and the embeddings read them, as the PyTorch runs they are timed beside.
    """
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in rows[0] and takes_token_types(model):
        names.append("token_type_ids")
    batches = parity_batches(rows, pad_id, names)
    graphs = write_segments(model, names, batches, folder, model.encoder.config.model_type)
    record = {"exits": model.spec.exits, "num_labels": model.spec.num_labels,
              "regression": regression, **graphs}  # fmt: skip
    (folder / EXPORT_JSON).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def graph_opset(path: Path) -> int:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def dev_logits(task: Task, model: MultiExitModel, data_dir: Path, batch_size: int) -> dict:
    """The arrays of ``dev_logits.npz`` (keys in the module docstring)."""
    pad_id = model.encoder.config.pad_token_id or 0
    arrays: dict[str, np.ndarray] = {"exits": np.array(model.spec.exits, dtype=np.int64)}
    splits = [name for name, _, _ in task.dev_splits]
    arrays["splits"] = np.array(splits)
    for i, split in enumerate(splits):
        rows = load_split(data_dir, split)
        suffix = "" if i == 0 else f"_{split}"
        arrays[f"logits{suffix}"] = all_exit_logits(
            model, rows, batch_size, pad_id, task.is_regression
        )  # [E, N, C]
        arrays[f"labels{suffix}"] = split_labels(rows, task)  # [N]
    return arrays


def write_tokenizer_file(tokenizer, path: Path) -> None:
    """The fast tokenizer's ``tokenizer.json``, which ``tokenizers.Tokenizer.from_file`` reads."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise UserError(
            f"the tokenizer ({type(tokenizer).__name__}) has no fast version, so there is no "
            "tokenizer.json for a serving box: train from a checkpoint with a fast tokenizer"
        )
    backend.save(str(path))


def write_int8(task: Task, model: MultiExitModel, rows: list[dict], logits: dict,
               report: dict, folder: Path, batch_size: int) -> dict:  # fmt: skip
    """Int8 copies of the segments in ``folder``, and their dev figures against the model's
    ``logits`` (``dev_logits``) at every exit and at the export's default setting."""
    from aclpipe.early_exit.onnx_runtime import OnnxEarlyExit
    from aclpipe.exits import quantize

    files = quantize.quantize_segments(folder, [s["file"] for s in report["segments"]])
    runtime = OnnxEarlyExit(folder, NO_EXIT, None, precision="int8",
                            record={**report, "int8": {"segments": files}})  # fmt: skip
    chained = quantize.chain_logits(runtime, rows, report["pad_id"], batch_size)
    dev = quantize.compare(task, logits["logits"], chained, logits["labels"],
                           model.spec.exits, report["default_setting"])  # fmt: skip
    return {"segments": files, "method": quantize.METHOD, "split": task.dev_splits[0][0], **dev}


def int8_line(record: dict) -> str:
    at = record["default_setting"]
    agree = record.get("label_agreement")
    setting = "the full model" if at["policy"] == NO_EXIT else f"{at['policy']} {at['threshold']}"
    return (
        f"int8 segments: dev score per exit {_points(record['score_int8'])} against "
        f"{_points(record['score'])}"
        + (f", labels agree {min(agree):.1%}-{max(agree):.1%}" if agree else "")
        + f"; at the default setting ({setting}) "
        f"{at['score_int8'] * 100:.2f} against {at['score'] * 100:.2f}, mean exit layer "
        f"{at['mean_exit_layer_int8']:.2f} against {at['mean_exit_layer']:.2f}"
    )


def _points(scores: list[float]) -> str:
    return "/".join(f"{s * 100:.1f}" for s in scores)


def export_exits(
    task: Task,
    model_dir: Path,
    data_dir: Path,
    out_dir: Path,
    batch_size: int = 64,
    opset: int | None = None,
    console: Console | None = None,
    curves_path: Path | None = None,
    reference_path: Path | None = None,
    int8: bool = False,
) -> dict:
    """Export the model in ``model_dir``: ONNX segments, tokenizer, model folder, dev logits.

    Args:
        task: the GLUE task the model was trained on.
        model_dir: a folder written by ``aclpipe finetune`` (weights, config, tokenizer).
        data_dir: the prepared ``data/<task>/`` (dev rows for the parity check and logits).
        out_dir: ``models/<task>/<method>/export/``; replaced whole, or left untouched on error.
        batch_size: batch size for the dev logits.
        opset: ONNX opset; None takes the exporter's default.
        console: where to print the parity lines.
        curves_path, reference_path: the method's ``curves.json`` and ce's ``metrics.json``,
            from which the default exit setting is chosen (``aclpipe.early_exit.settings``).
        int8: also write int8 segments and measure them on dev (``exits.quantize``).

    Returns:
        The ``export.json`` record.
    """
    if task.embeds:
        raise UserError(
            f"{task.name} is a sentence-embedding task: it has no exits to export for early "
            "exit (its embeddings are scored by `aclpipe sts-eval`)"
        )
    import onnxruntime
    import transformers

    console = console or Console()
    model = load_multi_exit(model_dir).eval()
    tokenizer = load_tokenizer_from(model_dir)
    rows = load_split(data_dir, task.dev_splits[0][0])
    names = _input_names(model, tokenizer)
    pad_id = model.encoder.config.pad_token_id or 0
    batches = parity_batches(rows, pad_id, names)
    model_type = model.encoder.config.model_type
    with atomic.atomic_dir(out_dir) as tmp:
        start = time.perf_counter()
        graphs = write_segments(model, names, batches, tmp, model_type, opset)
        seconds = round(time.perf_counter() - start, 2)
        _print_parity(console, graphs)
        write_tokenizer_file(tokenizer, tmp / EXPORT_TOKENIZER)
        save_model_folder(model, tokenizer, tmp / EXPORT_MODEL, task)
        logits = dev_logits(task, model, data_dir, batch_size)
        np.savez(tmp / DEV_LOGITS, **logits)
        default = _default_setting(task, curves_path, reference_path, console)
        report = {
            "task": task.name,
            "model_type": model_type,
            "exits": model.spec.exits,
            "pooling": model.spec.pooling,
            "num_labels": model.spec.num_labels,
            "labels": list(task.labels),
            "regression": task.is_regression,
            "pad_id": pad_id,
            "tokenizer": EXPORT_TOKENIZER,
            "model_folder": EXPORT_MODEL,
            **graphs,
            "default_setting": default,
            "export_seconds": seconds,
            "parity_rows": sum(len(b["input_ids"]) for b in batches),
            "opset": graph_opset(tmp / graphs["embeddings"]["file"]),
            "dev_logits": DEV_LOGITS,
            "versions": {m.__name__: m.__version__ for m in (torch, onnxruntime, transformers)},
        }
        if int8:
            report["int8"] = write_int8(task, model, rows, logits, report, tmp, batch_size)
            console.print(int8_line(report["int8"]), highlight=False)
        (tmp / EXPORT_JSON).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def _input_names(model: MultiExitModel, tokenizer) -> list[str]:
    """The graphs' inputs: ``token_type_ids`` only where the model reads them."""
    names = ["input_ids", "attention_mask"]
    if uses_token_types(model, tokenizer):
        names.append("token_type_ids")
    return names


def _print_parity(console: Console, graphs: dict) -> None:
    """One line per exit segment: its file, its layers, and how far ONNX is from torch."""
    for record in graphs["segments"]:
        console.print(
            f"exit {record['exit']}: {record['file']} (layers {record['layers'][0]}.."
            f"{record['layers'][1]})  max |onnx - torch|: logits "
            f"{record['max_abs_diff_logits']:.2e}, states {record['max_abs_diff_states']:.2e}, "
            f"chain {record['chain_max_abs_diff_logits']:.2e}",
            highlight=False,
        )


def _default_setting(
    task: Task, curves_path: Path | None, reference_path: Path | None, console: Console
) -> dict:
    """The export's default exit setting (``aclpipe.early_exit.settings``), with a note when it
    falls back."""
    if curves_path is None or reference_path is None:
        default = fallback("no curves.json given to the export", task.is_regression)
    else:
        default = choose_default(curves_path, reference_path, task.is_regression)
    if default["source"] == "fallback":
        console.print(f"note: default exit setting {default['policy']} "
                      f"{default['threshold']}: {default['reason']}", highlight=False)  # fmt: skip
    return default
