"""The checks of ``campaign/params.yaml``'s ``campaign:`` section that read one part of it
(the file and its keys, the task and seed lists, the few-shot sizes and settings);
``aclpipe.study.campaign.plan.load_campaign`` puts them together. Every problem is a one-line
``UserError``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.study.campaign.cells import Cells


def read_spec(path: Path) -> tuple[dict, dict]:
    """The params file's body without its ``campaign:`` section, and that section (its keys
    checked)."""
    if not path.exists():
        raise UserError(f"campaign file {path} not found: pass --campaign campaign/params.yaml")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError:
        raise UserError(f"{path} is not valid YAML: fix the syntax") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("campaign"), dict):
        raise UserError(f"{path} has no campaign: section (tasks, seeds, runs)")
    spec = raw.pop("campaign")
    keys = {"tasks", "seeds", "runs", "ablations", "ablation_seeds", "experiment", "variants"}
    keys |= {"task_settings", "verdicts", "fewshot", "fewshot_settings", "cells", "peers"}
    unknown = set(spec) - keys - {"tune", "resources"}
    if unknown:
        raise UserError(
            f"unknown key campaign.{sorted(unknown)[0]} in {path}: use {', '.join(sorted(keys))}, tune, resources"
        )
    return raw, spec


def read_lists(
    spec: dict, path: Path
) -> tuple[list[str], list[int], list[str], list[str], list[int]]:
    """``tasks``, ``seeds``, ``runs``, ``ablations`` and ``ablation_seeds``, checked."""
    tasks, seeds, runs = spec.get("tasks"), spec.get("seeds"), spec.get("runs")
    for key, value in (("tasks", tasks), ("seeds", seeds), ("runs", runs)):
        if not isinstance(value, list) or not value:
            raise UserError(f"campaign.{key} in {path} must be a non-empty list")
    for name in tasks:
        get_task(name)
    ablations, ablation_seeds = spec.get("ablations") or [], spec.get("ablation_seeds") or seeds
    for key, value in (("seeds", seeds), ("ablation_seeds", ablation_seeds)):
        if not isinstance(value, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in value
        ):
            raise UserError(
                f"campaign.{key} in {path} must be a list of whole numbers, got {value}"
            )
    if not isinstance(ablations, list) or set(ablations) & set(runs):
        raise UserError(f"campaign.ablations in {path} must be a list of runs not in campaign.runs")
    return tasks, seeds, runs, ablations, ablation_seeds


def cells_runs(cells: dict[str, Cells]) -> list[str]:
    """The runs a few-shot study's blocks beside its grid plan."""
    return [run for block in cells.values() for run in block.runs]


def read_fewshot(
    spec: dict, path: Path, cells: dict[str, Cells]
) -> tuple[list[int], dict[int, dict[str, Any]]]:
    """``campaign.fewshot`` (N, ascending, each once) and ``campaign.fewshot_settings`` (for
    the grid's N and the cells')."""
    sizes, settings = spec.get("fewshot") or [], spec.get("fewshot_settings") or {}
    where = f"campaign.fewshot in {path}"
    if not isinstance(sizes, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes
    ):
        raise UserError(f"{where} must be a list of training-set sizes (whole numbers > 0)")
    if sizes != sorted(set(sizes)):
        raise UserError(f"{where} must list each N once, ascending, got {sizes}")
    if sizes and spec.get("ablations"):
        raise UserError(f"{where}: a few-shot study has no ablations; list every run in runs")
    if not isinstance(settings, dict):
        raise UserError(f"campaign.fewshot_settings in {path} must map N to settings")
    every = set(sizes) | {n for block in cells.values() for n in block.fewshot}
    for n, body in settings.items():
        if n not in every or not isinstance(body, dict):
            raise UserError(f"campaign.fewshot_settings.{n}: not an N of campaign.fewshot or cells")
        check_sections(body, f"campaign.fewshot_settings.{n}", "N")
    return sizes, settings


def check_sections(body: dict, where: str, per: str) -> None:
    """Settings per task or per N may only override these sections of the params."""
    for section in body:
        if section not in ("data", "train", "evaluate", "model"):
            raise UserError(
                f"{where}.{section}: only data, train, evaluate and model can differ per {per}"
            )
