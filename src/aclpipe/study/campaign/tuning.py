"""The base recipe: which configuration of ``campaign.tune.grid`` scores best on validation.

Every configuration trains ``campaign.tune.method`` (ce) with each tuning seed on the task's
train split minus its validation split; the pick is the best mean final-exit score on the
validation split (ties: the configuration listed first). Dev scores are shown beside, never
used to choose. ``reports/campaign/<task>/tuning.{md,json}`` say what was tried, what won,
and whether ``campaign.task_settings.<task>.train`` (what every run uses) is the pick.

How far the pick is ahead is tested like a campaign claim (``paired``): the pick against the
runner-up, final exit, paired bootstrap over the validation examples (and the tuning seeds
when there are several). A margin whose interval holds 0 means the grid does not tell the
two recipes apart; the pick stands by the rule, and the report says so.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import yaml

from aclpipe import atomic
from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.layout import (
    METRICS,
    PREDICTIONS,
    RUN_RECORD,
    TRAINING_LOG,
    TRAINING_LOG_PARAMS,
    TUNING_JSON,
    TUNING_MD,
    VALIDATION,
)
from aclpipe.study.campaign.markdown import campaign_reports, p_value
from aclpipe.study.campaign.plan import Campaign
from aclpipe.study.stats.measures import Measure
from aclpipe.study.stats.paired import check_same_examples, paired_bootstrap


def summarise(campaign: Campaign, task: str) -> dict:
    """Per configuration: its knobs, and validation and dev final-exit scores per seed."""
    tuning = campaign.tuning
    if tuning is None:
        raise UserError(
            f"{campaign.path} has no campaign.tune section: add one (method, seeds, grid)"
        )
    rows = []
    for config, knobs in tuning.configs_for(task).items():
        scores: dict[str, dict[int, float]] = {VALIDATION: {}, "dev": {}}
        forwards: set[str] = set()
        for seed in tuning.seeds:
            folder = campaign.layout.tune_run(task, config, seed)
            if not (folder / RUN_RECORD).exists():
                continue
            splits = json.loads((folder / METRICS).read_text(encoding="utf-8"))["splits"]
            if VALIDATION not in splits:
                raise UserError(
                    f"{folder} has no validation score: set data.validation_fraction in "
                    f"{campaign.path}, prepare the task again and rerun the grid"
                )
            for split in scores:
                scores[split][seed] = splits[split]["per_exit"][-1]["score"]
            forwards.add(_forward(folder))
        rows.append(
            {
                "config": config,
                "knobs": knobs,
                "seeds": sorted(scores[VALIDATION]),
                "validation": _mean(scores[VALIDATION]),
                "dev": _mean(scores["dev"]),
                "by_seed": {s: {k: v[s] for k, v in scores.items()} for s in scores[VALIDATION]},
                "forward": ", ".join(sorted(forwards)),
            }
        )
    done = [r for r in rows if len(r["seeds"]) == len(tuning.seeds)]
    pick = max(done, key=lambda r: r["validation"], default=None)  # max keeps the first of ties
    rest = [r for r in done if r is not pick]
    runner_up = max(rest, key=lambda r: r["validation"], default=None)
    used = campaign.task_settings.get(task, {}).get("train", {})
    in_use = next(  # the configuration every campaign run uses, when the grid holds it
        (r for r in done if all(used.get(k.split(".", 1)[1]) == v for k, v in r["knobs"].items())),
        None,
    )
    return {
        "task": task,
        "method": tuning.method,
        "seeds": tuning.seeds,
        "rows": rows,
        "complete": len(done) == len(rows),
        "pick": pick["config"] if pick else None,
        "pick_knobs": pick["knobs"] if pick else None,
        # the knobs every campaign run uses, against the pick's
        "in_use": {key: used.get(key.split(".", 1)[1]) for key in (pick["knobs"] if pick else {})},
        "margin": margin(campaign, task, pick, runner_up) if runner_up else None,
        # the pick against the configuration in use, where they differ
        "against_in_use": (
            margin(campaign, task, pick, in_use) if pick and in_use and in_use is not pick else None
        ),
    }


def margin(campaign: Campaign, task: str, pick: dict, runner_up: dict) -> dict | None:
    """The pick minus another configuration (the runner-up, or the one in use) on validation,
    final exit (points x100 in the markdown): ``paired_bootstrap``'s result plus the other's
    name (key ``runner_up``). None where a run has no
    per-example outputs (a grid from before predictions.npz was kept). The runs must have
    scored the same validation examples (``check_same_examples``)."""
    seen, outputs = [], {}
    for row in (pick, runner_up):
        per_seed = {}
        for seed in row["seeds"]:
            folder = campaign.layout.tune_run(task, row["config"], seed)
            if not (folder / PREDICTIONS).exists():
                return None
            with np.load(folder / PREDICTIONS) as data:
                if f"{VALIDATION}_logits" not in data.files:
                    return None
                labels = data[f"{VALIDATION}_labels"]
                final = data[f"{VALIDATION}_logits"][-1].argmax(-1)
            record = json.loads((folder / RUN_RECORD).read_text(encoding="utf-8"))
            seen.append((folder, labels, record.get("data")))
            per_seed[seed] = Measure("final", final[None, :])
        outputs[row["config"]] = per_seed
    check_same_examples(seen, VALIDATION, f"rerun the grid: aclpipe campaign tune --task {task}")
    result = paired_bootstrap(
        get_task(task), outputs[pick["config"]], outputs[runner_up["config"]], seen[0][1]
    )
    return {"runner_up": runner_up["config"], **result}


def _forward(folder: Path) -> str:
    """How the run's encoder forward ran in training: ``padding-free`` or ``padded`` (runs from
    before ``train.padding_free`` existed log no such key and ran padded)."""
    live = yaml.safe_load((folder / TRAINING_LOG / TRAINING_LOG_PARAMS).read_text(encoding="utf-8"))
    return "padding-free" if (live or {}).get("padding_free") else "padded"


def _mean(by_seed: dict[int, float]) -> float | None:
    return statistics.fmean(by_seed.values()) if by_seed else None


def applied(summary: dict) -> bool:
    """Whether ``task_settings.<task>.train`` holds the pick's knobs."""
    knobs = summary["pick_knobs"] or {}
    return bool(knobs) and all(summary["in_use"][k] == v for k, v in knobs.items())


def knobs_text(knobs: dict, sep: str = " ") -> str:
    """``lr 5e-05, epochs 5``: knobs without their section (``train.``), numbers by ``g``."""
    return ", ".join(
        f"{key.split('.', 1)[-1]}{sep}{value:g}"
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else f"{key.split('.', 1)[-1]}{sep}{value}"
        for key, value in knobs.items()
    )


def markdown(summary: dict) -> str:
    task, pick = summary["task"], summary["pick"]
    keys = list(dict.fromkeys(key for row in summary["rows"] for key in row["knobs"]))
    header = ["configuration", *keys, "seeds", "forward", "validation", "dev"]
    lines = [
        f"# {task}: the base recipe",
        f"`aclpipe campaign tune --task {task}` trained {summary['method']} with each "
        f"configuration below and seed(s) {', '.join(map(str, summary['seeds']))} on train minus "
        "the validation split; the pick is the best mean final-exit score on validation "
        "(x100). Dev is shown, never used to choose. Forward: how training ran the encoder "
        "(padding-free or padded: the same function and dropout draws, float rounding apart; "
        "docs/benchmarks.md).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in summary["rows"]:
        mark = " (pick)" if row["config"] == pick else ""
        cells = [f"{row['config']}{mark}", *(str(row["knobs"].get(k, "-")) for k in keys)]
        cells += [
            ", ".join(map(str, row["seeds"])) or "not run",
            row["forward"] or "-",
            _score(row["validation"]),
            _score(row["dev"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if pick is None:
        lines.append("No configuration has finished every seed yet: no pick.")
    elif applied(summary):
        lines.append(f"Every campaign run of {task} uses the pick ({pick}).")
    else:
        want = knobs_text(summary["pick_knobs"], ": ")
        used = knobs_text(summary["in_use"], ": ")
        lines.append(
            f"campaign.task_settings.{task}.train is not the pick: the campaign's runs use "
            f"`{{{used}}}`. To use the pick, set it to `{{{want}}}` in campaign/params.yaml "
            "and rerun the campaign's runs."
        )
    found = summary.get("margin")
    if found and found.get("seeds"):
        lines.append(
            f"The pick against the runner-up ({found['runner_up']}) on validation: "
            + _comparison(found)
            + (
                " The grid does not tell these two recipes apart; the pick stands by the rule "
                "(best validation score)."
                if found["verdict"] == "no detectable difference"
                else ""
            )
        )
    found = summary.get("against_in_use")
    if found and found.get("seeds") and found["runner_up"] != (summary.get("margin") or {}).get(
        "runner_up"
    ):
        lines.append(
            f"The pick against the configuration the campaign's runs use ({found['runner_up']}) "
            "on validation: " + _comparison(found)
        )
    at_edge = edges(summary)
    if at_edge:
        lines.append(
            "The pick lies at the grid's edge in "
            + ", ".join(f"{k} ({v:g}, the {side} tried)" for k, v, side in at_edge)
            + ": a better recipe may lie beyond it, which this grid cannot show."
        )
    if pick is not None and len(summary["seeds"]) == 1:
        lines.append(
            "One tuning seed cannot separate the top picks: each configuration is one draw "
            "of data order, initialisation and dropout, so the seed-to-seed spread of a "
            "recipe, which the campaign's noise floor shows to be of the order of a point "
            "(results.md), is not part of the comparison above."
        )
    if not summary["complete"]:
        lines.append("Some configurations have not finished: the pick may change.")
    return "\n".join(lines) + "\n"


def _comparison(found: dict) -> str:
    """``+0.82 [-1.56, +3.21] points (95% interval ...; p 0.2470): no detectable difference.``"""
    difference = f"{100 * found['difference']:+.2f} [{100 * found['low']:+.2f}, " + (
        f"{100 * found['high']:+.2f}]"
    )
    return (
        f"{difference} points (95% interval from a paired bootstrap over validation examples"
        + (" and tuning seeds" if len(found["seeds"]) > 1 else ", one tuning seed")
        + f"; p {p_value(found)}): {found['verdict']}."
    )


def edges(summary: dict) -> list[tuple[str, float, str]]:
    """``(knob, value, "largest" | "smallest")`` for each numeric knob the grid varies whose
    value in the pick is the largest or the smallest the grid tried."""
    pick = next((r for r in summary["rows"] if r["config"] == summary["pick"]), None)
    if pick is None:
        return []
    out = []
    for key, value in pick["knobs"].items():
        tried = {r["knobs"][key] for r in summary["rows"] if key in r["knobs"]}
        if len(tried) < 2 or not all(isinstance(v, (int, float)) for v in tried):
            continue
        if value == max(tried):
            out.append((key, value, "largest"))
        elif value == min(tried):
            out.append((key, value, "smallest"))
    return out


def _score(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def summaries(campaign: Campaign) -> dict[str, dict]:
    """``summarise`` of every task with tuning runs."""
    if campaign.tuning is None:
        return {}
    return {
        task: summarise(campaign, task)
        for task in campaign.tasks
        if campaign.layout.tune_runs(task).exists()
    }


def write_tuning(campaign: Campaign, reports_dir: Path) -> dict[str, dict]:
    """``reports/campaign/<task>/tuning.{md,json}`` for every task with tuning runs; returns
    their summaries."""
    out = summaries(campaign)
    for task, summary in out.items():
        folder = campaign_reports(reports_dir, task)
        atomic.write_text(folder / TUNING_JSON, json.dumps(summary, indent=2) + "\n")
        atomic.write_text(folder / TUNING_MD, markdown(summary))
    return out
