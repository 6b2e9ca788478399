"""Whether two library stacks train the same run: one campaign run, trained once on each,
compared file by file (``aclpipe campaign stack-compare``; ``campaign/stack_check.sh`` trains
both). A task whose runs span two stacks is one experiment only if they give the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from aclpipe.errors import UserError
from aclpipe.layout import RUN_RECORD, STACK_CHECK, STACK_CHECK_SCRIPT

ENVIRONMENT = "environment"  # the one part of run.json that names the stack


def stack(record: dict) -> str:
    """The stack a run ran on, as the reports name it: ``NVIDIA H200, torch 2.5.1, CUDA 12.4,
    transformers 4.46.0, Python 3.11.9``; a CPU run names its CPU where run.json has it
    (``cpu: AMD EPYC (family 25, model 17), torch ...``; runs before 2026-12-05 say ``cpu``)."""
    env = record.get(ENVIRONMENT)
    if not env:
        return "unrecorded"
    cuda = f", CUDA {env['cuda']}" if env.get("cuda", "none") != "none" else ""
    device = env.get("device", "?")
    if device == "cpu" and env.get("cpu"):
        device = f"cpu: {env['cpu']}"
    return (
        f"{device}, torch {env.get('torch', '?')}{cuda}, "
        f"transformers {env.get('transformers', '?')}, Python {env.get('python', '?')}"
    )


def _record(folder: Path) -> dict:
    path = folder / RUN_RECORD
    if not path.is_file():
        raise UserError(
            f"{folder} has no {RUN_RECORD}: give the folder of a finished campaign run "
            "(`aclpipe campaign run` writes it last)"
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not JSON ({e.msg}, line {e.lineno}): rerun that run") from e


def digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` but run.json, by path relative to it: its sha256."""
    files = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}
    return {
        name: hashlib.sha256(files[name].read_bytes()).hexdigest()
        for name in sorted(files)
        if name != RUN_RECORD
    }


def compare_runs(a: Path, b: Path) -> dict:
    """Compare run ``a`` with run ``b``: the same run (run.json equal but for its
    environment) on two stacks. Every other file is compared by its sha256."""
    ra, rb = _record(a), _record(b)
    run_a = {k: v for k, v in ra.items() if k != ENVIRONMENT}
    run_b = {k: v for k, v in rb.items() if k != ENVIRONMENT}
    if run_a != run_b:
        keys = sorted(k for k in run_a.keys() | run_b.keys() if run_a.get(k) != run_b.get(k))
        raise UserError(
            f"{a} and {b} are not the same run (their {RUN_RECORD} differ in "
            f"{', '.join(keys)}): train one task, run and seed with the same params on each stack"
        )
    if ra.get(ENVIRONMENT) == rb.get(ENVIRONMENT):
        raise UserError(
            f"{a} and {b} ran on the same stack ({stack(ra)}): train one of them on the other "
            f"stack ({STACK_CHECK_SCRIPT} does both)"
        )
    da, db = digests(a), digests(b)
    if not da or not db:
        raise UserError(
            f"{a if not da else b} holds only {RUN_RECORD}: give the folder of a finished "
            "campaign run, with its scores and predictions"
        )
    names = sorted(da.keys() | db.keys())
    env_a, env_b = ra.get(ENVIRONMENT, {}), rb.get(ENVIRONMENT, {})
    return {
        "run": {k: ra[k] for k in ("task", "run", "method", "seed")},
        "epochs": ra["params"]["train"]["epochs"],
        "train_examples": ra["data"]["splits"]["train"]["examples"],
        "stacks": [stack(ra), stack(rb)],
        "changed": {
            k: [env_a.get(k), env_b.get(k)]
            for k in sorted(env_a.keys() | env_b.keys())
            if env_a.get(k) != env_b.get(k)
        },
        "files": len(names),
        "differing": [n for n in names if da.get(n) != db.get(n)],
        "sha256": {n: [da.get(n), db.get(n)] for n in names},
    }


def load_check(path: Path) -> dict | None:
    """The recorded check, or None when none was made."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not JSON ({e.msg}): rerun {STACK_CHECK_SCRIPT}") from e


def stack_sentence(check: dict | None, stacks: set[str]) -> str | None:
    """What the report says under its table of stacks: nothing for one stack; else whether
    the recorded check compared these stacks and what it found."""
    if len(stacks) < 2:
        return None
    if check is None or not stacks <= set(check["stacks"]):
        return (
            f"These runs span {len(stacks)} stacks that no recorded check has compared: read a "
            f"task's claims as mixing stacks (`{STACK_CHECK_SCRIPT} <transformers version>` checks two)."
        )
    run = check["run"]
    what = (
        f"the same run ({run['task']} {run['run']} seed {run['seed']}, {check['epochs']} "
        f"epoch{'s' if check['epochs'] != 1 else ''} on {check['train_examples']} examples), "
        "trained on each"
    )
    changed = "; ".join(f"{k} {a} against {b}" for k, (a, b) in check["changed"].items())
    if not check["differing"]:
        return (
            f"Checked across the two stacks ({changed}): {what}, gave byte-identical files, "
            f"{check['files']} of {check['files']} (training curves, every exit's "
            f"predictions, scores, sweeps). This checks only what the two runs did not share: "
            f"{RUN_RECORD} does not record the CPU, the thread count or the other packages, and "
            f"{STACK_CHECK_SCRIPT} trains both on one machine with transformers alone swapped, so runs of "
            'these stacks made on other machines are outside it (README.md, "Stacks and '
            f'machines"). Rerun: `{STACK_CHECK_SCRIPT} <transformers version>`; campaign/{STACK_CHECK} '
            "holds each file's sha256 on both."
        )
    return (
        f"Checked across the two stacks ({changed}): {what}, differed in "
        f"{len(check['differing'])} of {check['files']} files "
        f"({', '.join(check['differing'])}): a task's claims over runs on both stacks mix them."
    )
