"""The results campaign: every method, several seeds, real GLUE, run through DVC.

``campaign/params.yaml`` is an ordinary params file (the knobs every run shares) plus a
``campaign:`` section that says what to run::

    campaign:
      tasks: [mrpc, rte, sst2]
      seeds: [1, 2, 3]                   # train.seed of each run; the data subsample is fixed
      runs: [ce, scl, acl, acl-nograd]   # the table order; a run is a method or a variant
      variants:                          # runs that change a method's knobs
        acl-nograd: {method: acl, set: {acl_grad: false}}
      task_settings:                     # per task, over the shared knobs
        sst2: {data: {max_train_samples: 10000, max_length: 64}, train: {epochs: 1}}

``campaign/dvc.yaml`` turns it into stages: ``prepare`` per task, ``run`` per seed x task x
run (train, score every exit, sweep the policies; the run's folder ``campaign/runs/<task>/
<run>-s<seed>/`` is committed, the weights are not kept) and ``report``, which aggregates the
runs into ``reports/<task>/results.{md,json}``, plots and ``reports/README.md``. DVC records
each finished run, so an interrupted campaign resumes where it stopped, and the report is
rebuilt from the committed runs in seconds.

The statistics and the published tables are in ``aclpipe.study.campaign_report``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from aclpipe import atomic
from aclpipe.config import Params, apply_overrides, params_from_dict
from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.layout import RUN_RECORD, TRAINING_LOG, Layout


@dataclass
class Variant:
    method: str
    knobs: dict[str, Any]  # over methods.<method> of the shared params


@dataclass
class Campaign:
    path: Path  # campaign/params.yaml
    base: dict[str, Any]  # the params file without its campaign section
    tasks: list[str]
    seeds: list[int]
    runs: list[str]
    variants: dict[str, Variant]
    task_settings: dict[str, dict[str, Any]]

    @property
    def root(self) -> Path:
        """The campaign's folder: data/, runs/ and the scratch models/ live here."""
        return self.path.parent

    @property
    def layout(self) -> Layout:
        return Layout(self.root)

    def run_dir(self, task: str, run: str, seed: int) -> Path:
        return self.layout.run(task, run, seed)

    def variant(self, run: str) -> Variant:
        if run not in self.runs:
            raise UserError(
                f"unknown run {run!r}: campaign.runs in {self.path} lists {', '.join(self.runs)}"
            )
        return self.variants.get(run, Variant(run, {}))

    def overrides(self, task: str, run: str | None = None, seed: int | None = None) -> list[str]:
        """``section.key=value`` overrides that turn the shared params into this run's."""
        if task not in self.tasks:
            raise UserError(
                f"task {task!r} is not in campaign.tasks of {self.path} "
                f"({', '.join(self.tasks)}): add it there"
            )
        out = []
        for section, knobs in self.task_settings.get(task, {}).items():
            out += [f"{section}.{key}={_yaml_value(value)}" for key, value in knobs.items()]
        if run is not None:
            variant = self.variant(run)
            out += [
                f"methods.{variant.method}.{key}={_yaml_value(value)}"
                for key, value in variant.knobs.items()
            ]
        if seed is not None:
            if seed not in self.seeds:
                raise UserError(
                    f"seed {seed} is not in campaign.seeds of {self.path} "
                    f"({', '.join(map(str, self.seeds))}): add it there"
                )
            out.append(f"train.seed={seed}")
        return out

    def params(self, task: str, run: str | None = None, seed: int | None = None) -> Params:
        raw = apply_overrides(copy.deepcopy(self.base), self.overrides(task, run, seed))
        return params_from_dict(raw)


def _yaml_value(value: Any) -> str:
    return "null" if value is None else json.dumps(value) if isinstance(value, str) else str(value)


def load_campaign(path: Path) -> Campaign:
    """Read and check ``campaign/params.yaml``; every problem is a one-line ``UserError``."""
    if not path.exists():
        raise UserError(f"campaign file {path} not found: pass --campaign campaign/params.yaml")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        raise UserError(f"{path} is not valid YAML: fix the syntax") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("campaign"), dict):
        raise UserError(f"{path} has no campaign: section (tasks, seeds, runs)")
    spec = raw.pop("campaign")
    unknown = set(spec) - {"tasks", "seeds", "runs", "variants", "task_settings"}
    if unknown:
        raise UserError(
            f"unknown key campaign.{sorted(unknown)[0]} in {path}: use tasks, seeds, runs, "
            "variants, task_settings"
        )
    from aclpipe.training.knobs import METHOD_NAMES, check_method

    tasks, seeds, runs = spec.get("tasks"), spec.get("seeds"), spec.get("runs")
    for key, value in (("tasks", tasks), ("seeds", seeds), ("runs", runs)):
        if not isinstance(value, list) or not value:
            raise UserError(f"campaign.{key} in {path} must be a non-empty list")
    for name in tasks:
        get_task(name)
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise UserError(f"campaign.seeds in {path} must be whole numbers, got {seeds}")
    variants = {}
    for name, body in (spec.get("variants") or {}).items():
        method = body.get("method") if isinstance(body, dict) else None
        variants[name] = Variant(
            check_method(method, f"campaign.variants.{name} needs method"),
            dict(body.get("set") or {}),
        )
    for name in runs:
        if name not in METHOD_NAMES and name not in variants:
            raise UserError(
                f"campaign.runs has {name!r}, which is neither a method ({', '.join(METHOD_NAMES)}) "
                "nor a variant under campaign.variants"
            )
    settings = spec.get("task_settings") or {}
    for task, body in settings.items():
        if task not in tasks or not isinstance(body, dict):
            raise UserError(f"campaign.task_settings.{task}: not a task of campaign.tasks")
        for section in body:
            if section not in ("data", "train", "evaluate", "model"):
                raise UserError(
                    f"campaign.task_settings.{task}.{section}: only data, train, evaluate "
                    "and model can differ per task"
                )
    campaign = Campaign(path, raw, tasks, seeds, runs, variants, settings)
    for task in tasks:  # every run's params must build: fail now, not hours in
        for run in runs:
            campaign.params(task, run, seeds[0])
    return campaign


# --- stages ----------------------------------------------------------------------------------


def prepare_task(campaign: Campaign, task_name: str, console: Console) -> dict:
    from aclpipe.data.prepare import prepare, resolve_glue_dir

    task, params = get_task(task_name), campaign.params(task_name)
    return prepare(
        task,
        params.data,
        params.model.name,
        campaign.layout.data(task.name),
        resolve_glue_dir(params.data, None),
        params.model.trust_remote_code,
    )


def run_one(campaign: Campaign, task_name: str, run: str, seed: int, console: Console) -> Path:
    """Train, score and sweep one run; write its folder (atomically) and drop the weights."""
    from aclpipe.data.prepared import load_meta
    from aclpipe.evaluation.evaluate import evaluate
    from aclpipe.modeling.device import pick_device
    from aclpipe.training.loop import finetune

    task, variant = get_task(task_name), campaign.variant(run)
    params = campaign.params(task_name, run, seed)
    data_dir = campaign.layout.data(task.name)
    scratch = campaign.layout.scratch(task.name, run, seed)
    out = campaign.run_dir(task.name, run, seed)
    finetune(task, variant.method, params, data_dir, scratch, console)  # resumes if cut off
    with atomic.atomic_dir(out) as tmp:
        device = pick_device(params.train.device)
        evaluate(task, variant.method, scratch, data_dir, tmp, params.evaluate, device, console)
        shutil.copytree(scratch / TRAINING_LOG, tmp / TRAINING_LOG)
        record = {
            "task": task.name,
            "run": run,
            "method": variant.method,
            "seed": seed,
            "overrides": campaign.overrides(task.name, run, seed),
            "params": dataclasses.asdict(params),
            "data": {k: v for k, v in load_meta(data_dir).items() if k != "tokenizer"},
            "command": f"aclpipe campaign run --task {task.name} --run {run} --seed {seed}",
            "environment": environment(device),
        }
        (tmp / RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(scratch, ignore_errors=True)  # 90 MB a run; the scores are what is kept
    return out


def environment(device: str) -> dict[str, str]:
    """Where a run ran: the same seed gives other weights on another device or library."""
    import platform

    import torch
    import transformers

    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda) if device == "cuda" else "none",
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
