"""The export stage: a trained multi-exit model as files a serving system can load alone.

``export_exits`` writes, atomically, into ``models/<task>/<method>/export/``:

- ``model/``: ``model.safetensors`` + ``aclpipe_model.json`` (``MultiExitModel.save``), the
  tokenizer files and ``aclpipe_task.json`` (task name and label names), so that
  ``load_multi_exit(out/"model")`` and ``AutoTokenizer.from_pretrained(out/"model")`` work
  without the training folder;
- ``exit_<k>.onnx``, one graph per exit: embeddings, layers ``1..k`` and exit ``k``'s head
  (pooler + classifier, eval mode). Inputs ``input_ids``, ``attention_mask`` (and
  ``token_type_ids`` when the tokenizer makes them and the embeddings read them), all
  ``[batch, sequence]`` int64; output ``logits [batch, C]``. Each graph is run with
  onnxruntime on real dev rows and compared with the PyTorch model's logits at that exit;
- ``dev_logits.npz``: logits at every exit on the dev split(s). Keys: ``exits [E]``,
  ``splits`` (dev split names), ``logits [E, N, C]`` and ``labels [N]`` for the task's first
  dev split, and ``logits_<split>`` / ``labels_<split>`` for every further one (MNLI:
  ``logits`` is dev_matched, ``logits_dev_mismatched`` the mismatched split);
- ``export.json``: exits, ONNX file names, max abs difference per exit, opset, versions.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from torch import nn

from aclpipe import atomic
from aclpipe.data.prepared import load_split
from aclpipe.data.tasks import Task
from aclpipe.errors import UserError
from aclpipe.evaluation.scoring import all_exit_logits, split_labels
from aclpipe.layout import DEV_LOGITS, EXPORT_JSON, EXPORT_MODEL, TASK_FILE
from aclpipe.modeling.backbone import load_tokenizer_from
from aclpipe.modeling.batching import collate
from aclpipe.modeling.layerwise import check_layerwise, forward_to_exits
from aclpipe.modeling.model import MultiExitModel, load_multi_exit

PARITY_ROWS = 6  # rows of spread lengths in the parity batch (plus one row on its own)


class ExitGraph(nn.Module):
    """Embeddings, layers ``1..k`` and exit ``k``'s head of a ``MultiExitModel``.

    Holds only the modules exit ``k`` needs (shared with the model, not copied), so the
    exported graph carries no deeper layer and no other head. Runs them through the model's
    ``LayerRunner`` as the early-exit runtime does (``aclpipe.modeling.layerwise``), but always
    with the mask (an exported graph cannot branch on whether a batch has padding); building
    one checks, once per model, that the layer run reproduces the model's forward.
    """

    def __init__(self, model: MultiExitModel, index: int, use_token_types: bool) -> None:
        super().__init__()
        check_layerwise(model)
        head = model.heads[index]
        self.runner = model.layer_runner()  # a plain object: its modules are registered below
        for name, module in self.runner.modules(head.layer).items():
            self.add_module(name, module)  # embeddings, layers, and what else the layers read
        self.head = head
        self.use_token_types = use_token_types

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        types = token_type_ids if self.use_token_types else None
        (logits,) = forward_to_exits(
            self.runner, [self.head], input_ids, attention_mask, types, skip_unpadded_mask=False
        )
        return logits  # [B, C]


def uses_token_types(model: MultiExitModel, tokenizer) -> bool:
    """True when the tokenizer makes ``token_type_ids`` and the embeddings take them."""
    import inspect

    accepted = inspect.signature(model.encoder.embeddings.forward).parameters
    return "token_type_ids" in tokenizer.model_input_names and "token_type_ids" in accepted


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


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's progress lines, warnings and registry chatter."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def export_exit(
    graph: ExitGraph, example: dict, path: Path, opset: int | None, layer: int, model_type: str
) -> None:
    """Export one exit graph with dynamic batch and sequence axes (``torch.export`` based)."""
    from torch.export import Dim

    batch, sequence = Dim("batch"), Dim("sequence")
    dynamic = {name: {0: batch, 1: sequence} for name in example}
    try:
        with _quiet_exporter():
            torch.onnx.export(
                graph,
                (),
                str(path),
                kwargs=example,
                input_names=list(example),
                output_names=["logits"],
                opset_version=opset,
                dynamo=True,
                dynamic_shapes=dynamic,
                external_data=False,  # one self-contained file per exit (models under 2 GB)
            )
    except Exception as err:  # the exporter raises many types; the user needs one line
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        raise UserError(
            f"ONNX export of exit {layer} ({model_type}) failed: {type(err).__name__}: {reason}"
        ) from err


def onnx_max_diff(
    path: Path, batches: list[dict], references: list[torch.Tensor], layer: int
) -> float:
    """Largest ``|onnx - torch|`` over the batches; ``references`` are ``[b, C]`` each."""
    import onnxruntime as ort

    feeds = [{name: tensor.numpy() for name, tensor in batch.items()} for batch in batches]
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs = [session.run(["logits"], feed)[0] for feed in feeds]  # [b, C] each
    except Exception as err:  # onnxruntime's errors carry C++ detail over many lines
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        raise UserError(f"onnxruntime cannot run exit {layer}'s graph: {reason}") from err
    gaps = [np.abs(out - ref.detach().numpy()).max() for out, ref in zip(outputs, references)]
    return float(max(gaps))


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


def export_exits(
    task: Task,
    model_dir: Path,
    data_dir: Path,
    out_dir: Path,
    batch_size: int = 64,
    opset: int | None = None,
    console: Console | None = None,
) -> dict:
    """Export the model in ``model_dir``: model folder, ONNX per exit, dev logits, report.

    Args:
        task: the GLUE task the model was trained on.
        model_dir: a folder written by ``aclpipe finetune`` (weights, config, tokenizer).
        data_dir: the prepared ``data/<task>/`` (dev rows for the parity check and logits).
        out_dir: ``models/<task>/<method>/export/``; replaced whole, or left untouched on error.
        batch_size: batch size for the dev logits.
        opset: ONNX opset; None takes the exporter's default.
        console: where to print the per-exit parity line.

    Returns:
        The ``export.json`` record.
    """
    import onnxruntime
    import transformers

    console = console or Console()
    model = load_multi_exit(model_dir).eval()
    tokenizer = load_tokenizer_from(model_dir)
    rows = load_split(data_dir, task.dev_splits[0][0])
    names = ["input_ids", "attention_mask"]
    if uses_token_types(model, tokenizer):
        names.append("token_type_ids")
    batches = parity_batches(rows, model.encoder.config.pad_token_id or 0, names)
    with torch.no_grad():
        references = [model(**batch).logits for batch in batches]  # [E, b, C] each
    model_type = model.encoder.config.model_type
    files, diffs, seconds = [], [], []
    with atomic.atomic_dir(out_dir) as tmp:
        save_model_folder(model, tokenizer, tmp / EXPORT_MODEL, task)
        for index, layer in enumerate(model.spec.exits):
            path = tmp / f"exit_{layer}.onnx"
            start = time.perf_counter()
            graph = ExitGraph(model, index, "token_type_ids" in names).eval()
            export_exit(graph, batches[0], path, opset, layer, model_type)
            seconds.append(round(time.perf_counter() - start, 2))
            diffs.append(onnx_max_diff(path, batches, [r[index] for r in references], layer))
            files.append(path.name)
            console.print(
                f"exit {layer}: {path.name}  max |onnx - torch| = {diffs[-1]:.2e}  "
                f"({seconds[-1]:.1f}s)",
                highlight=False,
            )
        np.savez(tmp / DEV_LOGITS, **dev_logits(task, model, data_dir, batch_size))
        report = {
            "task": task.name,
            "model_type": model_type,
            "exits": model.spec.exits,
            "pooling": model.spec.pooling,
            "num_labels": model.spec.num_labels,
            "labels": list(task.labels),
            "model_folder": EXPORT_MODEL,
            "inputs": names,
            "output": "logits",
            "onnx_files": files,
            "max_abs_diff": diffs,
            "export_seconds": seconds,
            "parity_rows": sum(len(b["input_ids"]) for b in batches),
            "opset": graph_opset(tmp / files[0]),
            "dev_logits": DEV_LOGITS,
            "versions": {m.__name__: m.__version__ for m in (torch, onnxruntime, transformers)},
        }
        (tmp / EXPORT_JSON).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report
