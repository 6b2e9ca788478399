"""A campaign's stages, as ``campaign/dvc.yaml`` runs them: prepare a task's data (in a few-shot
study, a seed's draw at every N), train and score one run, or one configuration of the tuning
grid, into its folder with its exact params and the stack it ran on (``run.json``)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from rich.console import Console

from aclpipe import atomic
from aclpipe.config import Params
from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.layout import RUN_RECORD, TRAINING_LOG
from aclpipe.study.campaign.environment import environment
from aclpipe.study.campaign.plan import Campaign


def prepare_task(
    campaign: Campaign, task_name: str, console: Console, seed: int | None = None
) -> list[dict]:
    """Prepare a task's data; in a few-shot study, seed's draw at every N (``seed`` given)."""
    from aclpipe.stages.prepare import prepare, resolve_glue_dir

    task = get_task(task_name)
    if seed is None:
        plans = [(campaign.params(task_name), campaign.layout.data(task.name))]
    else:
        if not campaign.fewshot:
            raise UserError(f"{campaign.path} has no campaign.fewshot: prepare without --seed")
        first = {  # a run planned at N on this task and seed: the data is every method's
            n: run
            for run, (_, n) in reversed(campaign.fewshot_runs.items())
            if seed in campaign.seeds_at(task.name, run)
        }
        runs = [first[n] for n in campaign.fewshot if n in first]
        if not runs:
            raise UserError(
                f"seed {seed} draws nothing on {task.name}: no run of {campaign.path} is planned "
                "for it (campaign.seeds, campaign.cells)"
            )
        plans = [
            (campaign.params(task_name, run, seed), campaign.data_dir(task.name, run, seed))
            for run in runs
        ]
    return [
        prepare(
            task,
            params.data,
            params.model.name,
            out,
            resolve_glue_dir(params.data, None),
            params.model.trust_remote_code,
        )
        for params, out in plans
    ]


def run_one(campaign: Campaign, task_name: str, run: str, seed: int, console: Console) -> Path:
    """Train, score and sweep one run; write its folder (atomically) and drop the weights."""
    task, variant = get_task(task_name), campaign.variant(run)
    if run in campaign.fewshot_runs:
        campaign.overrides(task.name, run, seed)  # a one-line error for a run not planned here
    record = {
        "task": task.name,
        "run": run,
        "method": variant.method,
        "seed": seed,
        "overrides": campaign.overrides(task.name, run, seed),
        "command": f"aclpipe campaign run --task {task.name} --run {run} --seed {seed}",
    }
    if variant.method in _peer_names():
        from aclpipe.study.campaign.peers import run_peer  # a peer's own code, not the loop

        return run_peer(campaign, task_name, run, seed, record, console)
    return _train_and_score(
        campaign,
        task_name,
        variant.method,
        campaign.params(task_name, run, seed),
        campaign.layout.scratch(task.name, run, seed),
        campaign.run_dir(task.name, run, seed),
        record,
        console,
        campaign.data_dir(task.name, run, seed),
    )


def _peer_names() -> tuple[str, ...]:
    from aclpipe.study.campaign.peers import PEER_NAMES

    return PEER_NAMES


def tune_one(campaign: Campaign, task_name: str, config: str, seed: int, console: Console) -> Path:
    """Train and score one configuration of the tuning grid into its folder under
    ``campaign/tune/<task>/``; like :func:`run_one` (the same files), with the grid's knobs."""
    task, tuning = get_task(task_name), campaign.tuning
    overrides = campaign.tune_overrides(task.name, config, seed)  # checks tuning and config
    assert tuning is not None
    record = {
        "task": task.name,
        "run": config,
        "method": tuning.method,
        "seed": seed,
        "overrides": overrides,
        "tuned": tuning.configs_for(task.name)[config],
        "command": f"aclpipe campaign tune --task {task.name} --config {config} --seed {seed}",
    }
    return _train_and_score(
        campaign,
        task_name,
        tuning.method,
        campaign.tune_params(task_name, config, seed),
        campaign.layout.tune_scratch(task.name, config, seed),
        campaign.layout.tune_run(task.name, config, seed),
        record,
        console,
    )


def _train_and_score(
    campaign: Campaign,
    task_name: str,
    method: str,
    params: Params,
    scratch: Path,
    out: Path,
    record: dict,
    console: Console,
    data_dir: Path | None = None,
) -> Path:
    """Train (resuming if cut off), score every exit on dev and validation, sweep; write
    ``out`` atomically (run.json last) and drop the weights. ``data_dir``: the prepared data
    (default: the task's)."""
    from aclpipe.data.prepared import load_meta
    from aclpipe.modeling.device import pick_device
    from aclpipe.stages.evaluate import evaluate
    from aclpipe.stages.finetune import finetune

    task = get_task(task_name)
    data_dir = data_dir or campaign.layout.data(task.name)
    finetune(task, method, params, data_dir, scratch, console)
    with atomic.atomic_dir(out) as tmp:
        device = pick_device(params.train.device)
        evaluate(task, method, scratch, data_dir, tmp, params.evaluate, device, console)
        shutil.copytree(scratch / TRAINING_LOG, tmp / TRAINING_LOG)
        record = {
            **record,
            "params": dataclasses.asdict(params),
            "data": {k: v for k, v in load_meta(data_dir).items() if k != "tokenizer"},
            "environment": environment(device),
        }
        (tmp / RUN_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(scratch, ignore_errors=True)  # 90 MB a run; the scores are what is kept
    return out
