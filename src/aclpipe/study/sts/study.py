"""The STS study (reports/sts/README.md): objective x pooling x seeds on one checkpoint.

``sts/params.yaml`` is an ordinary aclpipe params file (only what the runs change from the code's
defaults; ``load_study`` fills in the rest and the objectives' methods) plus an ``sts:`` section::

    sts:
      objectives: {unsup: {method: simcse-unsup, task: sentences},
                   sup: {method: simcse-sup, task: sentence-pairs}}
      poolings: [cls, mean, layer-attention]
      seeds: [1, 2, 3, 4, 5]
      verdicts: {margin: 1.0, resamples: 10000}   # the report's rules (study.verdicts)

A run (``aclpipe sts run --objective unsup --pooling mean --seed 1``) trains the objective's
method with ``model.pooling`` and ``train.seed`` set, scores the trained model on STS-B dev
and the STS Benchmark test (``study.sts_scores``), and keeps the scores, the per-pair cosines
and the DVCLive log under ``sts/runs/<objective>-<pooling>-s<seed>/``; the weights are
dropped. ``aclpipe sts zero-shot`` scores the untrained checkpoint once
(``sts/runs/zero-shot/``). Stages run from the repository root (sts/dvc.yaml: ``wdir: ..``).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console

from aclpipe import atomic
from aclpipe.config import Params, apply_overrides, params_from_dict, resolved
from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.layout import META, RUN_RECORD, STS, TRAINING_LOG, Layout
from aclpipe.study.stats.verdicts import Rules, rules_from
from aclpipe.study.sts.embeddings import POOLINGS

ROOT = Path(STS)
COSINES = "cosines.npz"
ZERO_SHOT = "zero-shot"


@dataclass(frozen=True)
class Objective:
    method: str
    task: str


@dataclass
class StsStudy:
    raw: dict  # the params file without its sts: section, every value written out
    objectives: dict[str, Objective]
    poolings: list[str]
    seeds: list[int]
    root: Path = ROOT
    verdicts: Rules = Rules()  # the report's verdict rules (sts.verdicts)

    @property
    def layout(self) -> Layout:
        return Layout(self.root)

    def params(self, overrides: list[str] = ()) -> Params:
        raw = json.loads(json.dumps(self.raw))  # a deep copy
        return params_from_dict(apply_overrides(raw, list(overrides)))

    def run_dir(self, objective: str, pooling: str, seed: int) -> Path:
        return self.layout.runs() / f"{objective}-{pooling}-s{seed}"

    def zero_shot_dir(self) -> Path:
        return self.layout.runs() / ZERO_SHOT


def load_study(path: Path) -> StsStudy:
    """Read and check ``sts/params.yaml``; every problem is one line."""
    if not path.is_file():
        raise UserError(f"STS study file {path} not found: pass --study sts/params.yaml")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        raise UserError(f"{path} is not valid YAML: fix the syntax") from None
    spec = raw.pop("sts", None) if isinstance(raw, dict) else None
    if not isinstance(spec, dict):
        raise UserError(f"{path} has no sts: section (objectives, poolings, seeds)")
    unknown = set(spec) - {"objectives", "poolings", "seeds", "verdicts"}
    if unknown:
        raise UserError(
            f"unknown key sts.{sorted(unknown)[0]} in {path}: use objectives, poolings, seeds, "
            "verdicts"
        )
    verdicts = spec.get("verdicts") or {}
    if not isinstance(verdicts, dict) or "rule_floor" in verdicts:  # no gradient rule here
        raise UserError(f"sts.verdicts in {path} must be {{margin: points, resamples: n}}")
    rules = rules_from(verdicts, f"sts.verdicts in {path}")
    from aclpipe.training.knobs import check_method

    objectives = {}
    for name, entry in (spec.get("objectives") or {}).items():
        if not isinstance(entry, dict) or set(entry) != {"method", "task"}:
            raise UserError(f"sts.objectives.{name} in {path} must be {{method: ..., task: ...}}")
        check_method(
            entry["method"], f"sts.objectives.{name} has unknown method {entry['method']!r}"
        )
        get_task(entry["task"])
        objectives[name] = Objective(entry["method"], entry["task"])
    poolings, seeds = spec.get("poolings") or [], spec.get("seeds") or []
    if not objectives or not poolings or not seeds:
        raise UserError(f"sts.objectives, sts.poolings and sts.seeds in {path} must not be empty")
    bad = [p for p in poolings if p not in POOLINGS]
    if bad:
        raise UserError(f"sts.poolings has unknown {bad[0]!r}: use {', '.join(POOLINGS)}")
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise UserError(f"sts.seeds in {path} must be whole numbers, got {seeds}")
    raw = resolved(raw, [o.method for o in objectives.values()])  # checked now, not at a run
    return StsStudy(raw, objectives, list(poolings), list(seeds), verdicts=rules)


def _pair_files(params: Params) -> dict:
    from aclpipe.study.sts.scores import default_pair_files

    return default_pair_files(Path(params.data.glue_dir) if params.data.glue_dir else None)


def prepare_task(study: StsStudy, task_name: str) -> dict:
    """Build a sentence task into ``sts/data/<task>/`` with the study's data settings."""
    from aclpipe.stages.prepare import prepare

    params = study.params()
    glue = Path(params.data.glue_dir) if params.data.glue_dir else None
    task = get_task(task_name)
    return prepare(task, params.data, params.model.name, study.layout.data(task.name), glue)


def run_one(study: StsStudy, objective: str, pooling: str, seed: int, console: Console) -> Path:
    """Train one run, score it, keep the scores and cosines; the weights are dropped."""
    from aclpipe.stages.finetune import finetune
    from aclpipe.study.sts.scores import sts_scores

    if objective not in study.objectives:
        raise UserError(f"unknown objective {objective!r}: use {', '.join(study.objectives)}")
    if pooling not in POOLINGS:
        raise UserError(f"unknown pooling {pooling!r}: use {', '.join(POOLINGS)}")
    spec = study.objectives[objective]
    params = study.params([f"model.pooling={pooling}", f"train.seed={seed}"])
    task = get_task(spec.task)
    scratch = study.layout.model(task.name, f"{objective}-{pooling}-s{seed}")
    started = time.perf_counter()
    finetune(task, spec.method, params, study.layout.data(task.name), scratch, console)
    trained_s = time.perf_counter() - started
    result, cosines = sts_scores(
        params.model.name,
        _pair_files(params),
        scratch,
        None,
        params.data.max_length,
        params.evaluate.batch_size,
        zero_shot=False,  # scored once, by `aclpipe sts zero-shot`
    )
    meta = json.loads((study.layout.data(task.name) / META).read_text(encoding="utf-8"))
    record = {
        "objective": objective,
        "method": spec.method,
        "task": task.name,
        "pooling": pooling,
        "seed": seed,
        "train_seconds": round(trained_s, 1),
        "scored_seconds": round(time.perf_counter() - started - trained_s, 1),
        "data": {"built": meta.get("built"), "splits": meta["splits"]},
        "train": json.loads(json.dumps(study.params([f"train.seed={seed}"]).train.__dict__)),
        "result": result,
    }
    out = study.run_dir(objective, pooling, seed)
    with atomic.atomic_dir(out) as tmp:
        (tmp / RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        np.savez_compressed(
            tmp / COSINES,
            **{f"trained_{s}": c for s, c in cosines.trained.items()},
            **{f"layers_{s}": c for s, c in cosines.encoder_layers.items()},
            **{f"gold_{s}": g for s, g in cosines.gold.items()},
        )
        shutil.copytree(scratch / TRAINING_LOG, tmp / TRAINING_LOG)
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def zero_shot(study: StsStudy) -> Path:
    """Score the untrained checkpoint once: every pooling at every layer, dev and test."""
    from aclpipe.study.sts.scores import sts_scores

    params = study.params()
    result, cosines = sts_scores(
        params.model.name,
        _pair_files(params),
        None,
        None,
        params.data.max_length,
        params.evaluate.batch_size,
    )
    out = study.zero_shot_dir()
    with atomic.atomic_dir(out) as tmp:
        record = {"model": params.model.name, "result": result}
        (tmp / RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        np.savez_compressed(
            tmp / COSINES,
            **{f"layers_{s}": c for s, c in cosines.zero_shot.items()},
            **{f"gold_{s}": g for s, g in cosines.gold.items()},
        )
    return out
