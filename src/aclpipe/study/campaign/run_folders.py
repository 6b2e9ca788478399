"""A campaign's finished run folders (``campaign/runs/<task>/<run>-s<seed>/``: run.json,
metrics.json, the per-example outputs of every exit in predictions.npz, and the training log),
read for the reports: the outputs, checked to share their data, and what the training log
says of the gradient angles and of how often a gradient rule altered a step."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.layout import METRICS, PREDICTIONS, RUN_RECORD, VALIDATION
from aclpipe.study.campaign import speed as campaign_speed
from aclpipe.study.campaign.plan import Campaign
from aclpipe.study.stats import measures as scoring
from aclpipe.study.stats import paired, verdicts


def load_run(task_name: str, folder: Path) -> dict:
    """One run folder: ``{"record", "metrics", "outputs": scoring.RunOutputs, "folder"}``."""
    task = get_task(task_name)
    record = json.loads((folder / RUN_RECORD).read_text(encoding="utf-8"))
    if not (folder / PREDICTIONS).exists():
        raise UserError(
            f"{folder} has no {PREDICTIONS} (a run from before per-example outputs were kept): "
            f"rerun it: delete the folder, then `{record.get('command', 'aclpipe campaign run')}`"
        )
    dev = task.dev_splits[0][0]
    with np.load(folder / PREDICTIONS) as data:
        arrays = {key: data[key] for key in data.files}
    evaluate = record.get("params", {}).get("evaluate", {})
    outputs = scoring.RunOutputs(
        task,
        arrays["exits"].astype(np.int64),
        int(arrays["num_layers"]),
        arrays[f"{dev}_logits"],
        arrays[f"{dev}_labels"],
        arrays.get(f"{VALIDATION}_logits"),
        arrays.get(f"{VALIDATION}_labels"),
        evaluate.get("grid_points", 11),
        evaluate.get("patience_eps", 0.1),
    )
    metrics = json.loads((folder / METRICS).read_text(encoding="utf-8"))
    return {"record": record, "metrics": metrics, "outputs": outputs, "folder": folder}


def load_runs(campaign: Campaign, task: str) -> dict[str, dict[int, dict]]:
    """``{run: {seed: run folder}}`` of the campaign's planned runs that have finished."""
    found: dict[str, dict[int, dict]] = {}
    for run in (r for r in campaign.runs if task in campaign.tasks_for(r)):
        for seed in campaign.seeds_for(run):
            folder = campaign.run_dir(task, run, seed)
            if (folder / RUN_RECORD).exists():
                found.setdefault(run, {})[seed] = load_run(task, folder)
    check_same_data([r for s in found.values() for r in s.values()])
    return found


def check_same_data(runs: list[dict]) -> None:
    """Every run of a task was trained and scored on the same prepared data (the same dev
    labels in the same order and the same data record), so that a paired comparison pairs
    the same examples: ``paired.check_same_examples``."""
    paired.check_same_examples(
        [(r["folder"], r["outputs"].dev_labels, r["record"].get("data")) for r in runs],
        "dev",
        "rerun it on the campaign's prepared data",
    )


def angle_summary(by_seed: dict) -> dict:
    from aclpipe.run_log import has_run_log
    from aclpipe.study.angles import read_angles
    from aclpipe.study.angles import summarise as summarise_angles

    folders = [r["folder"] for _, r in sorted(by_seed.items())]
    angles = [read_angles(f) if has_run_log(f) else ([], []) for f in folders]
    if not any(a for a, _ in angles):
        return {}
    pooled = [a for seed_angles, _ in angles for a in seed_angles]
    per_seed = [summarise_angles(a, f) for a, f in angles if a]
    bins = [0] * 18  # [0, 10), [10, 20), ... [170, 180] degrees
    for a in pooled:
        bins[min(int(a // 10), 17)] += 1
    return {
        "angles": {
            "steps": len(pooled),
            "share_over_90": campaign_speed.over_seeds([x["share_over_90"] for x in per_seed]),
            "altered_rate": campaign_speed.over_seeds([x["altered_rate"] for x in per_seed]),
            "mean_angle": statistics.fmean(pooled),
            "histogram": bins,
        }
    }


def rule_use(by_seed: dict, seeds: list[int], rules) -> dict:
    """The share of training steps the rule run's gradient rule altered, over ``seeds``."""
    from aclpipe.run_log import has_run_log
    from aclpipe.study.angles import read_angles

    altered = [
        flag
        for s in seeds
        if has_run_log(by_seed[s]["folder"])
        for flag in read_angles(by_seed[s]["folder"])[1]
    ]
    share, used = verdicts.exercised(altered, rules.rule_floor)
    return {"rule_altered": share, "rule_steps": len(altered), "rule_exercised": used}
