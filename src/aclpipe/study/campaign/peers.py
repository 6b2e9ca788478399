"""What a user with a few labelled sentences reaches for instead: the few-shot study's peers.

Two runs of a few-shot study that are not this project's training loop, scored like every
other run (the same draw, the same dev examples, the same run-folder files: ``metrics.json``,
``predictions.npz`` with the final exit's log-probabilities as ``dev_logits [1, N, C]``,
``curves.json``, ``run.json``), so that the ledger, ``aclpipe campaign record`` and the report
treat them as runs:

- ``linear-probe``: logistic regression on the frozen checkpoint's sentence embeddings, made
  with the checkpoint's own pooling (``model.pooling``; mean for all-MiniLM-L6-v2) and, where
  its sentence-transformers pipeline ends in ``Normalize``, L2-normalised, from the same
  tokens the fine-tuned runs see. The head is scikit-learn's ``LogisticRegression`` with a
  fixed ``C`` (``campaign.peers.linear-probe``), nothing chosen on dev: the floor that any
  fine-tuning must clear, and SetFit's own head on SetFit's own embeddings before its
  contrastive step.
- ``setfit``: the ``setfit`` package (Tunstall et al. 2022), run by ``setfit_child.py`` in an
  environment of its own, built from ``fewshot/peers/setfit-requirements.txt`` (its pins need
  transformers 4, this project uses 5), on the same checkpoint loaded from its local folder.
  Its recipe is ``campaign.peers.setfit`` over the library's defaults; the package version and
  every training argument are recorded in run.json's ``peer``.

Pairs (MRPC, RTE) reach the linear probe as the pair tokenization the other runs use, and
SetFit as one text, the two sentences joined by the tokenizer's separator token (SetFit
embeds single texts).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from aclpipe import atomic
from aclpipe.data.tasks import Task, get_task
from aclpipe.errors import UserError
from aclpipe.layout import CURVES_CSV, CURVES_JSON, METRICS, PREDICTIONS, RUN_RECORD

LINEAR_PROBE, SETFIT = "linear-probe", "setfit"
PEER_NAMES = (LINEAR_PROBE, SETFIT)
SETFIT_CHILD = Path(__file__).with_name("setfit_child.py")  # runs in SetFit's environment


@dataclass(frozen=True)
class LinearProbeConfig:
    C: float = (
        1.0  # scikit-learn's default, and SetFit's head: fixed, not tuned (no validation split)
    )
    max_iter: int = 1000  # lbfgs converges within this on every draw; a warning is recorded if not
    batch_size: int = 64  # embedding only: no effect on a score


@dataclass(frozen=True)
class SetFitConfig:
    environment: str = ".venv-setfit"  # its own virtual environment, relative to the root
    requirements: str | None = None  # the pinned file that builds it (the study names its own)
    num_iterations: int = 20  # pairs = 2 x num_iterations x N (the SetFit paper's R = 20)
    num_epochs: int = 1  # one pass over the pairs
    batch_size: int = 16
    body_learning_rate: float = 2.0e-5
    max_length: int | None = None  # null: the task's data.max_length, as the other runs


def parse_peers(body: Any, where: str) -> dict[str, Any]:
    """``campaign.peers``: each peer's knobs over its defaults; an unknown key is an error."""
    body = body or {}
    if not isinstance(body, dict) or set(body) - set(PEER_NAMES):
        raise UserError(f"{where} maps {' and '.join(PEER_NAMES)} to their knobs")
    out: dict[str, Any] = {}
    for name, kind in ((LINEAR_PROBE, LinearProbeConfig), (SETFIT, SetFitConfig)):
        knobs = body.get(name) or {}
        fields = {f.name for f in dataclasses.fields(kind)}
        if not isinstance(knobs, dict) or set(knobs) - fields:
            bad = sorted(set(knobs) - fields)[0] if isinstance(knobs, dict) else knobs
            raise UserError(f"{where}: {name} has no knob {bad!r}; use {', '.join(sorted(fields))}")
        out[name] = kind(**knobs)
    return out


def setup_command(config: SetFitConfig) -> str:
    """The command that builds SetFit's environment."""
    if config.requirements is None:
        return "`make setfit-env`"
    return (
        f"`make setfit-env` (python3 -m venv {config.environment} && "
        f"{config.environment}/bin/python -m pip install -r {config.requirements})"
    )


def setfit_python(config: SetFitConfig) -> Path:
    """SetFit's interpreter; a one-line error naming how to build it when it is missing."""
    python = Path(config.environment) / "bin" / "python"
    if not python.exists():
        raise UserError(
            f"setfit's environment {config.environment} is missing: build it with {setup_command(config)}"
        )
    return python


# --- inputs ----------------------------------------------------------------------------------


def embed(model_name: str, rows: list[dict], pooling: str, batch_size: int) -> np.ndarray:
    """Sentence embeddings ``[N, H]`` of tokenized rows by the frozen checkpoint (eval mode):
    the masked mean of the last layer (``mean``) or its [CLS] vector (``cls``)."""
    import torch

    from aclpipe.modeling.backbone import load_encoder

    encoder = load_encoder(model_name).eval()
    pad = encoder.config.pad_token_id or 0
    out = []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            width = max(len(r["input_ids"]) for r in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)  # [B, T]
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            types = torch.zeros((len(batch), width), dtype=torch.long)
            for i, r in enumerate(batch):
                n = len(r["input_ids"])
                ids[i, :n], mask[i, :n] = torch.tensor(r["input_ids"]), 1
                if "token_type_ids" in r:
                    types[i, :n] = torch.tensor(r["token_type_ids"])
            hidden = encoder(
                input_ids=ids, attention_mask=mask, token_type_ids=types
            ).last_hidden_state
            if pooling == "mean":  # [B, T, H] -> [B, H]
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
            else:
                pooled = hidden[:, 0]
            out.append(pooled.float().numpy())
    return np.concatenate(out)


def normalises(resolved: str) -> bool:
    """Whether the checkpoint's sentence-transformers pipeline ends in ``Normalize``."""
    modules = Path(resolved) / "modules.json"
    if not modules.exists():
        return False
    return any(m.get("type", "").endswith("Normalize") for m in json.loads(modules.read_text()))


def texts(task: Task, params, data_dir: Path) -> tuple[list[tuple], list[tuple]]:
    """``(train, dev)`` as ``(text_a, text_b, label)``: the draw's rows of the training file
    (its ids in meta.json) and the dev split the prepared data scores, read from the same
    source; checked against the prepared labels."""
    from aclpipe.data.glue_sources import local_available, read_hub, read_local
    from aclpipe.data.prepared import load_meta, load_split, subsample
    from aclpipe.stages.prepare import resolve_glue_dir

    meta, glue = load_meta(data_dir), resolve_glue_dir(params.data, None)
    if local_available(task, glue):
        read = lambda split: read_local(task, glue, split)  # noqa: E731
    else:
        read = lambda split: read_hub(task, split, params.data.hub_id, glue_dir=glue)  # noqa: E731
    ids = meta["fewshot"]["ids"]
    every = read("train")
    train = [every[i] for i in ids]
    dev_name = task.dev_splits[0][0]
    dev = subsample(read(dev_name), params.data.max_eval_samples, params.data.seed)
    for split, examples in (("train", train), (dev_name, dev)):
        labels = [r["label"] for r in load_split(data_dir, split)]
        if labels != [e.label for e in examples]:
            raise UserError(
                f"{data_dir}: the {split} texts read again from {meta['source']} do not match "
                "the prepared split: prepare the draw again"
            )
    as_tuples = lambda xs: [(e.text_a, e.text_b, e.label) for e in xs]  # noqa: E731
    return as_tuples(train), as_tuples(dev)


# --- the peers ---------------------------------------------------------------------------------


def linear_probe(
    task: Task, params, data_dir: Path, config: LinearProbeConfig, seed: int
) -> tuple[np.ndarray, dict]:
    """``(log-probabilities [N_dev, C], record)`` of the probe on the frozen checkpoint."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    from aclpipe.data.prepared import load_split
    from aclpipe.modeling.backbone import default_pooling, resolve_model

    resolved = resolve_model(params.model.name)
    pooling = params.model.pooling if params.model.pooling != "auto" else default_pooling(resolved)
    if pooling not in ("mean", "cls"):
        raise UserError(f"linear-probe pools by mean or cls, not {pooling!r}: set model.pooling")
    train_rows, dev_rows = (
        load_split(data_dir, "train"),
        load_split(data_dir, task.dev_splits[0][0]),
    )
    train_x = embed(params.model.name, train_rows, pooling, config.batch_size)
    dev_x = embed(params.model.name, dev_rows, pooling, config.batch_size)
    normalise = normalises(resolved)
    if normalise:
        train_x = train_x / np.linalg.norm(train_x, axis=1, keepdims=True)
        dev_x = dev_x / np.linalg.norm(dev_x, axis=1, keepdims=True)
    labels = np.asarray([r["label"] for r in train_rows])
    head = LogisticRegression(C=config.C, max_iter=config.max_iter, random_state=seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        head.fit(train_x, labels)
    if list(head.classes_) != list(range(task.num_labels)):
        raise UserError(f"the draw lacks a class of {task.name}: draw at least one of each")
    record = {
        "name": LINEAR_PROBE,
        "recipe": {**dataclasses.asdict(config), "pooling": pooling, "normalize": normalise,
                   "head": "sklearn.linear_model.LogisticRegression (lbfgs)"},
        "converged": not any(issubclass(w.category, ConvergenceWarning) for w in caught),
        "iterations": int(np.max(head.n_iter_)),
    }  # fmt: skip
    return head.predict_log_proba(dev_x).astype(np.float32), record


def setfit(
    task: Task, params, data_dir: Path, config: SetFitConfig, seed: int, console: Console
) -> tuple[np.ndarray, dict]:
    """``(log-probabilities [N_dev, C], record)`` of SetFit, trained in its own environment."""
    import torch

    from aclpipe.modeling.backbone import resolve_model

    python = setfit_python(config)
    train, dev = texts(task, params, data_dir)
    request = {
        "model": resolve_model(params.model.name),
        "train": [[a, b, int(y)] for a, b, y in train],
        "dev": [[a, b] for a, b, _ in dev],
        "num_labels": task.num_labels,
        "seed": seed,
        "max_length": config.max_length or params.data.max_length,
        "threads": torch.get_num_threads(),
        "arguments": {
            "num_iterations": config.num_iterations,
            "num_epochs": config.num_epochs,
            "batch_size": config.batch_size,
            "body_learning_rate": config.body_learning_rate,
        },
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1", "PYTHONPATH": ""}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="setfit-") as tmp:
        (Path(tmp) / "request.json").write_text(json.dumps(request), encoding="utf-8")
        done = subprocess.run(
            [os.path.abspath(python), str(SETFIT_CHILD), tmp],  # the venv's own link, not resolved
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        console.print(done.stdout[-4000:] + done.stderr[-4000:], highlight=False, markup=False)
        if done.returncode != 0:
            raise RuntimeError(f"setfit failed ({done.returncode}): {done.stderr[-2000:]}")
        reply = json.loads((Path(tmp) / "reply.json").read_text(encoding="utf-8"))
        with np.load(Path(tmp) / "dev.npz") as arrays:
            log_probs = arrays["log_probs"].astype(np.float32)
    record = {"name": SETFIT, "recipe": {**dataclasses.asdict(config), "max_length": request["max_length"]},
              **reply}  # fmt: skip
    return log_probs, record


# --- a run -----------------------------------------------------------------------------------


def run_peer(campaign, task_name: str, run: str, seed: int, record: dict, console: Console) -> Path:
    """Train a peer on the run's draw, score dev, write the run's folder atomically."""
    from aclpipe.data.prepared import load_meta, load_split
    from aclpipe.evaluation.scoring import exit_scores, majority_prediction, majority_scores
    from aclpipe.modeling.backbone import load_encoder
    from aclpipe.stages.evaluate import curves_csv
    from aclpipe.study.campaign.environment import environment

    task = get_task(task_name)
    if task.is_regression:
        raise UserError(f"the peers classify; {task.name} is a regression task")
    params, data_dir = (
        campaign.params(task.name, run, seed),
        campaign.data_dir(task.name, run, seed),
    )
    peer = record["method"]
    config = campaign.peers[peer]
    if peer == LINEAR_PROBE:
        log_probs, about = linear_probe(task, params, data_dir, config, seed)
    else:
        log_probs, about = setfit(task, params, data_dir, config, seed, console)
    dev = task.dev_splits[0][0]
    labels = np.asarray([r["label"] for r in load_split(data_dir, dev)], dtype=np.int64)
    layers = load_encoder(params.model.name).config.num_hidden_layers
    logits = log_probs[None]  # [E=1, N, C]: one exit, the last layer
    per_exit = exit_scores(task, logits, labels)
    majority = majority_scores(task, majority_prediction(task, data_dir), labels)
    score = per_exit[-1]["score"]
    metrics = {
        "task": task.name,
        "method": peer,
        "exits": [layers],
        "splits": {dev: {"examples": len(labels), "per_exit": [{"layer": layers, **per_exit[-1]}],
                         "final_score": score, "average_over_exits": score,
                         "majority_score": majority["score"], "majority_metrics": majority["metrics"]}},
        "final_score": score,
        "average_over_exits": score,
        "gradient_rule": [],
        "majority_score": majority["score"],
    }  # fmt: skip
    curves = {"task": task.name, "method": peer, "split": dev, "exits": [layers],
              "num_layers": layers, "points": [], "full_model": {"score": score}}  # fmt: skip
    out = campaign.run_dir(task.name, run, seed)
    with atomic.atomic_dir(out) as tmp:
        (tmp / METRICS).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        (tmp / CURVES_JSON).write_text(json.dumps(curves, indent=2) + "\n", encoding="utf-8")
        (tmp / CURVES_CSV).write_text(curves_csv([]), encoding="utf-8")
        np.savez_compressed(
            tmp / PREDICTIONS,
            exits=np.asarray([layers], dtype=np.int64),
            num_layers=np.int64(layers),
            **{f"{dev}_logits": logits, f"{dev}_labels": labels},
        )
        full = {
            **record,
            "params": dataclasses.asdict(params),
            "data": {k: v for k, v in load_meta(data_dir).items() if k != "tokenizer"},
            "environment": environment("cpu"),
            "peer": about,
        }
        (tmp / RUN_RECORD).write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")
    console.print(f"{task.name} {run} seed {seed}: dev {score:.4f}", highlight=False)
    shutil.rmtree(campaign.layout.scratch(task.name, run, seed), ignore_errors=True)
    return out
