"""Training logs on disk: written through DVCLive, read back as plain records.

A finished ``finetune`` writes ``<model folder>/dvclive/`` in DVCLive's own layout, so that
``dvc exp show`` lists the training metrics and ``dvc plots`` draws the curves of every
experiment (dvc.yaml declares both)::

    params.yaml                          the run: task, method, exits, processes
    metrics.json                         the last value of every metric (DVCLive's summary)
    plots/metrics/train/<key>.tsv        one row per optimiser step: ``step  <key>``
    plots/metrics/dev/<key>.tsv          one row per finished epoch: ``step  <key>``

Per step (``train/``): ``loss`` (main + aux), ``main``, ``stage``, ``epoch``, ``lr``, and
when the method has an auxiliary objective ``aux``; when two gradients were taken, the
gradient rule's record ``cosine``, ``altered`` (1: ACL-Grad dropped the aux term, GR
projected) and ``grad_norm_ratio``. Per epoch (``dev/``): ``stage``, ``epoch`` and the dev
score of each exit, ``score_L<layer>``.

The training loop keeps the same records in memory (and in its resumable checkpoints) and
hands them to :func:`write_run_log` once, inside the model folder's atomic write, so an
interrupted run never leaves a partial log beside a trusted model. :func:`read_run_log`
gives the records back exactly (floats round-trip through their ``repr``); ``angles``,
``evaluate`` and the campaign read them through it. Campaign runs recorded before DVCLive
(``steps.jsonl`` + ``history.json``) are still read.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from aclpipe.errors import UserError
from aclpipe.layout import LEGACY_HISTORY, LEGACY_STEPS, TRAINING_LOG_PARAMS
from aclpipe.layout import TRAINING_LOG as LIVE_DIR

# Step record keys and their Python types when read back (DVCLive stores numbers only).
_STEP_KEYS = {
    "loss": float,
    "main": float,
    "aux": float,
    "cosine": float,
    "altered": bool,
    "grad_norm_ratio": float,
    "stage": int,
    "epoch": int,
    "lr": float,
}


@dataclass
class RunLog:
    """What a training run logged: the same records the loop kept in memory."""

    run: dict  # task, method, exits, processes
    history: list[dict]  # per epoch: stage, epoch, step, dev_scores (one per exit)
    steps: list[dict]  # per optimiser step: step, stage, epoch, lr, loss, main, [aux, ...]


def write_run_log(folder: Path, run: dict, history: list[dict], steps: list[dict]) -> None:
    """Write the records into ``folder/dvclive`` through DVCLive (no dvc.yaml, no experiment:
    the pipeline's dvc.yaml declares the metrics and plots)."""
    from dvclive import Live

    with Live(str(folder / LIVE_DIR), save_dvc_exp=False, dvcyaml=False, report=None) as live:
        live.log_params(run)
        for row in steps:
            live.step = row["step"]
            for key in _STEP_KEYS:
                if key in row:
                    value = row[key]
                    live.log_metric(f"train/{key}", int(value) if key == "altered" else value)
        for entry in history:
            live.step = entry["step"]
            live.log_metric("dev/stage", entry["stage"])
            live.log_metric("dev/epoch", entry["epoch"])
            for layer, score in zip(run["exits"], entry["dev_scores"]):
                live.log_metric(f"dev/score_L{layer}", score)


def _read_tsv(path: Path) -> dict[int, str]:
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    return {int(step): value for step, value in rows[1:]}


def _number(text: str, kind: type):
    if kind is bool:
        return bool(int(text))
    if kind is int:
        return int(text)
    return float(text)  # 'nan' too: a cosine with a zero gradient


def read_run_log(folder: Path) -> RunLog:
    """The records of the run trained into ``folder`` (a model folder or a campaign run)."""
    live = folder / LIVE_DIR
    if not live.is_dir():
        if (folder / LEGACY_STEPS).exists():
            return _read_legacy(folder)
        raise UserError(
            f"no training log in {folder} (no {LIVE_DIR}/): train it with `aclpipe finetune`"
        )
    run = yaml.safe_load((live / TRAINING_LOG_PARAMS).read_text(encoding="utf-8"))
    steps: dict[int, dict] = {}
    for key, kind in _STEP_KEYS.items():
        path = live / "plots" / "metrics" / "train" / f"{key}.tsv"
        if path.exists():
            for step, text in _read_tsv(path).items():
                steps.setdefault(step, {"step": step})[key] = _number(text, kind)
    dev = live / "plots" / "metrics" / "dev"
    history = []
    if (dev / "epoch.tsv").exists():
        stages, epochs = _read_tsv(dev / "stage.tsv"), _read_tsv(dev / "epoch.tsv")
        scores = [_read_tsv(dev / f"score_L{layer}.tsv") for layer in run["exits"]]
        for step in epochs:
            history.append(
                {
                    "stage": int(stages[step]),
                    "epoch": int(epochs[step]),
                    "step": step,
                    "dev_scores": [float(s[step]) for s in scores],
                }
            )
    return RunLog(run, history, [steps[s] for s in sorted(steps)])


def has_run_log(folder: Path) -> bool:
    return (folder / LIVE_DIR).is_dir() or (folder / LEGACY_STEPS).exists()


def _read_legacy(folder: Path) -> RunLog:
    with open(folder / LEGACY_STEPS, encoding="utf-8") as f:
        steps = [json.loads(line) for line in f]
    summary: dict = {"epochs": []}
    if (folder / LEGACY_HISTORY).exists():
        summary = json.loads((folder / LEGACY_HISTORY).read_text(encoding="utf-8"))
    history = summary.pop("epochs")
    return RunLog(summary, history, steps)
