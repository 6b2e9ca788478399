"""The export-hf stage: a trained model into a folder transformers (or sentence-transformers)
loads, with its model card.

Reads the trained model (``models/<task>/<method>/``), its dev scores when the evaluate stage
wrote them (``reports/<task>/<method>/metrics.json``), the exit setting (the export-exits
folder's ``default_setting``, else the one ``aclpipe.early_exit.settings`` picks from the
evaluate stage's curves, else its fallback) and the recipe from the params file; the writing
is ``aclpipe.exits.hf_export``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from aclpipe.config import Params
from aclpipe.data.tasks import Task
from aclpipe.early_exit.settings import choose_default
from aclpipe.errors import UserError
from aclpipe.exits.hf_export import write_hf_folder, write_sentence_transformers
from aclpipe.exits.model_card import CARD_TAG, CardFacts, render
from aclpipe.layout import CURVES_JSON, EXPORT_JSON, HF_CARD, METRICS, Layout
from aclpipe.modeling.backbone import load_tokenizer_from, resolve_model
from aclpipe.modeling.model import load_multi_exit

TRAIN_KNOBS = ("epochs", "batch_size", "lr", "head_lr", "weight_decay", "warmup_ratio",
               "max_grad_norm", "seed")  # fmt: skip
DATA_KNOBS = ("max_length", "max_train_samples", "seed")
UNKNOWN_LICENSE = "other"  # the Hub's value when no license is known


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def exit_setting(task: Task, method: str, layout: Layout) -> dict:
    """The export-exits folder's default setting, else the evaluate stage's pick, else the
    fallback (``settings.choose_default``), each with its ``source``."""
    record = _read(layout.export(task.name, method) / EXPORT_JSON)
    if record and record.get("default_setting"):
        return record["default_setting"]
    curves = layout.report(task.name, method) / CURVES_JSON
    reference = layout.report(task.name, "ce") / METRICS
    return choose_default(curves, reference, task.is_regression)


def base_license(base_model: str | None) -> str:
    """The ``license`` of the base model's own card when it is a local folder, else ``other``."""
    if not base_model:
        return UNKNOWN_LICENSE
    card = Path(resolve_model(base_model)) / HF_CARD
    try:
        text = card.read_text(encoding="utf-8")
    except OSError:
        return UNKNOWN_LICENSE
    if text.startswith("---"):
        import yaml

        try:
            meta = yaml.safe_load(text.split("---", 2)[1]) or {}
        except yaml.YAMLError:
            return UNKNOWN_LICENSE
        if isinstance(meta, dict) and isinstance(meta.get("license"), str):
            return meta["license"]
    return UNKNOWN_LICENSE


def recipe(method: str, params: Params, model) -> dict:
    knobs = dataclasses.asdict(params.method(method))
    return {
        f"methods.{method}": knobs or {"(none)": "-"},
        "model": {
            "pooling": model.spec.pooling,
            "exits": model.spec.exits,
            "dropout": model.spec.dropout,
        },  # fmt: skip
        "train": {k: getattr(params.train, k) for k in TRAIN_KNOBS},
        "data": {k: getattr(params.data, k) for k in DATA_KNOBS},
    }


def written_by_export_hf(folder: Path) -> bool:
    """Whether ``folder`` holds a model card export-hf wrote (tagged ``aclpipe``)."""
    text = (folder / HF_CARD).read_text(encoding="utf-8") if (folder / HF_CARD).is_file() else ""
    if not text.startswith("---"):
        return False
    import yaml

    try:
        meta = yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return False
    return isinstance(meta, dict) and CARD_TAG in (meta.get("tags") or [])


def check_out_dir(out_dir: Path) -> None:
    """Refuse, before anything is read or written, a folder export-hf cannot write or must not
    replace: it replaces its folder whole, so only an empty one or its own earlier output."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} is a file, and export-hf writes a folder: give --out a new "
                        "folder's path")  # fmt: skip
    if out_dir.is_dir() and any(out_dir.iterdir()) and not written_by_export_hf(out_dir):
        raise UserError(
            f"{out_dir} is a folder export-hf did not write, and export-hf replaces its folder "
            "whole: give --out a new folder's path (or remove that folder first)"
        )
    parent = out_dir.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"--out {out_dir} cannot be written: {parent} is a file, not a folder; "
                        "give a path in a folder")  # fmt: skip
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"--out {out_dir} cannot be written: {parent} is not writable; give a "
                        "path in a folder you can write to")  # fmt: skip


def export_hf(
    task: Task,
    method: str,
    params: Params,
    layout: Layout,
    out_dir: Path | None = None,
    plain: bool = False,
    license: str | None = None,
) -> Path:
    """Write the folder for ``method`` on ``task`` (default ``models/<task>/<method>/hf``)."""
    if task.embeds and plain:
        raise UserError(
            f"--plain writes a stock classifier, and {task.name} is a sentence-embedding task: "
            "drop --plain (export-hf writes a sentence-transformers folder for it)"
        )
    model_dir = layout.model(task.name, method)
    out_dir = out_dir or layout.hf_export(task.name, method)
    check_out_dir(out_dir)
    model = load_multi_exit(model_dir).eval()
    tokenizer = load_tokenizer_from(model_dir)
    embeds = task.embeds
    setting = (
        {"policy": "none"} if embeds or model.num_exits == 1 else exit_setting(task, method, layout)
    )
    facts = CardFacts(
        task=task, method=method, base_model=model.base_model,
        license=license or base_license(model.base_model), exits=list(model.spec.exits),
        pooling=model.spec.pooling, library="sentence-transformers" if embeds else "transformers",
        plain=plain, setting=setting, recipe=recipe(method, params, model),
        metrics=_read(layout.report(task.name, method) / METRICS),
    )  # fmt: skip
    if embeds:
        write_sentence_transformers(model, tokenizer, out_dir, render(facts))
    else:
        write_hf_folder(model, tokenizer, task, out_dir, setting, render(facts), plain)
    return out_dir
