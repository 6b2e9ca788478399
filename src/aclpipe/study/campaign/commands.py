"""What each ``aclpipe campaign`` command does, one function per command: load the campaign
file, run, print what was written, and raise a one-line ``UserError`` on failure. The Typer
commands (``aclpipe.study.cli``) only parse options; the options' raw values are read here,
after the campaign file, so that a bad campaign file is the first error a user sees.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from aclpipe import atomic
from aclpipe.cli_options import counts, parse_list
from aclpipe.errors import UserError
from aclpipe.layout import REPORTS_README, RESULTS_MD, RUNS, STACK_CHECK
from aclpipe.study.campaign.plan import load_campaign


def prepare(
    campaign: Path, task: list[str] | None, seed: list[str] | None, console: Console
) -> None:
    """Prepare the tasks named (default: campaign.tasks), every name checked before any is
    written; in a few-shot study, each seed's draw at every N."""
    from aclpipe.study.campaign.runs import prepare_task

    spec = load_campaign(campaign)
    names = parse_list(task, "--task") or spec.tasks
    chosen = parse_list(seed, "--seed", int)
    if chosen and not spec.fewshot:
        raise UserError(f"{campaign} has no campaign.fewshot: prepare without --seed")
    per_task = {  # a few-shot study draws, per task, the seeds some run is planned for there
        name: chosen or (spec.draws_on(name) if spec.fewshot else [None]) for name in names
    }
    for name, seeds in per_task.items():  # every name and seed checked before any is written
        spec.overrides(name)
        for s in seeds:
            if s is not None and s not in spec.draws_on(name):
                spec.overrides(name, spec.runs[0], s)  # the one-line error of an unplanned seed
                raise UserError(
                    f"seed {s} draws nothing on {name}: no run of {campaign} is planned for it"
                )
    for name, seeds in per_task.items():
        for s in seeds:
            for meta in prepare_task(spec, name, console, s):
                draw = f" (draw of {meta['fewshot']['examples']}, seed {s})" if s else ""
                line = f"prepared {name}{draw} from {meta['source']}: {counts(meta)}"
                console.print(line, highlight=False)


def run(campaign: Path, task: str, run: str, seed: int, console: Console) -> None:
    """Train, score and sweep one run."""
    from aclpipe.study.campaign.runs import run_one

    spec = load_campaign(campaign)
    out = run_one(spec, task, run, seed, console)
    console.print(f"wrote {out}", highlight=False)


def params(campaign: Path, task: str, run: str, seed: int) -> None:
    """Print one run's params as an ordinary params file, headed by the commands that rerun it.
    A relative ``data.glue_dir`` (relative to the folder the study's stages run in, this one)
    is printed absolute, so the run can be redone in a folder of its own: prepare and finetune
    write data/ and models/ under the working folder, where in the repository's root they would
    replace the default pipeline's."""
    import yaml

    spec = load_campaign(campaign)
    raw = spec.raw_params(task, run, seed)
    glue = (raw.get("data") or {}).get("glue_dir")
    if glue and not Path(glue).is_absolute():
        raw["data"]["glue_dir"] = str(Path(glue).resolve())
    method = spec.variant(run).method
    print(f"# {spec.path}, {task} {run} seed {seed}; in an empty folder (prepare and finetune "
          "write data/ and models/ there):")  # fmt: skip
    print(f"#   aclpipe prepare --params FILE --task {task}")
    print(f"#   aclpipe finetune --params FILE --task {task} --method {method}")
    print(yaml.safe_dump(raw, sort_keys=False), end="")


def run_pending(
    campaign: Path,
    workers: int,
    task: list[str] | None,
    seed: list[str] | None,
    threads: int | None,
    console: Console,
    backend: str = "local",
    address: str | None = None,
    run: list[str] | None = None,
) -> None:
    """Every run without a folder yet (of ``run`` only, when given); prints the ``dvc commit``
    that records the finished."""
    from aclpipe.study.campaign import runner as campaign_runner

    spec = load_campaign(campaign)
    task_list, seed_list = parse_list(task, "--task"), parse_list(seed, "--seed", int)
    done, failed = campaign_runner.run_pending(
        spec,
        workers,
        console,
        task_list,
        seed_list,
        runs=parse_list(run, "--run"),
        threads=threads,
        backend=backend,
        address=address,
    )
    if done:  # also when some failed: the finished ones are kept and can be recorded
        console.print(
            f"{len(done)} runs written; record them in DVC's lock with: aclpipe campaign record "
            f"--campaign {spec.path} (one pass), or {campaign_runner.commit_command(spec, done)}",
            highlight=False,
        )
    if failed:
        raise UserError(
            f"{len(failed)} of {len(done) + len(failed)} runs failed (first: {failed[0]}); "
            f"see campaign/models/<task>/<run>-s<seed>.log, fix, and run again"
        )


def tune(
    campaign: Path,
    task: list[str] | None,
    config: str | None,
    seed: int | None,
    workers: int,
    threads: int | None,
    reports: Path,
    console: Console,
    backend: str = "local",
    address: str | None = None,
) -> None:
    """One configuration of the tuning grid (``config`` with one task and its seed), else
    every one not yet run; then tuning.md per task, with the pick."""
    from aclpipe.study.campaign.markdown import campaign_reports
    from aclpipe.study.campaign.runner import TUNE, commit_command
    from aclpipe.study.campaign.runner import run_pending as run_configurations
    from aclpipe.study.campaign.runs import tune_one
    from aclpipe.study.campaign.tuning import TUNING_MD, write_tuning

    spec = load_campaign(campaign)
    task_list = parse_list(task, "--task")
    if config is not None:
        if len(task_list or []) != 1 or seed is None:
            raise UserError("--config needs one --task and a --seed")
        console.print(
            f"wrote {tune_one(spec, task_list[0], config, seed, console)}", highlight=False
        )
        failed: list[str] = []
    else:
        done, failed = run_configurations(
            spec,
            workers,
            console,
            task_list,
            kind=TUNE,
            threads=threads,
            backend=backend,
            address=address,
        )
        if done:
            console.print(f"record them with: {commit_command(spec, done, TUNE)}", highlight=False)
    for name, summary in write_tuning(spec, reports).items():
        pick = summary["pick"] or "none yet"
        console.print(
            f"{name}: pick {pick}; wrote {campaign_reports(reports, name) / TUNING_MD}",
            highlight=False,
        )
    if failed:
        raise UserError(
            f"{len(failed)} configurations failed (first: {failed[0]}); see "
            "campaign/models/<task>/tune-<config>-s<seed>.log, fix, and run again"
        )


def stack_compare(campaign: Path, first: Path, second: Path, console: Console) -> Path:
    """Compare one run's folders from two library stacks and write the campaign's
    stack_check.json (atomically); return its path."""
    from aclpipe.study.campaign.stack_check import compare_runs

    spec = load_campaign(campaign)
    check = compare_runs(first, second)
    out = spec.root / STACK_CHECK
    atomic.write_text(out, json.dumps(check, indent=2) + "\n")
    same = check["files"] - len(check["differing"])
    console.print(
        f"{same} of {check['files']} files identical ({' | '.join(check['stacks'])}); wrote {out}",
        highlight=False,
    )
    if check["differing"]:
        console.print(f"differing: {', '.join(check['differing'])}", highlight=False)
    return out


def wallclock(campaign: Path, runs_in: Path | None, console: Console) -> None:
    """Merge the timed runs of ``runs_in`` (a study folder) into <study>/wallclock.tsv."""
    from aclpipe.study.fewshot import wallclock as clock

    spec = load_campaign(campaign)
    root = spec.root if runs_in is None else runs_in
    if not (root / RUNS).is_dir():
        raise UserError(
            f"{root} has no {RUNS}/ folder: pass --from the study's folder (e.g. fewshot)"
        )
    path, rows = clock.record(spec, root)
    summary = clock.summarise(rows)  # the rows just written, not read back
    for cell in summary["cells"]:
        console.print(
            f"{cell['task']} N={cell['n'] or '-'}: {cell['runs']} runs, "
            f"{cell['mean_seconds']:.0f} s a run",
            highlight=False,
        )
    console.print(
        f"wrote {path} ({len(rows)} runs): {summary['run_seconds'] / 3600:.1f} h of run time in "
        f"{summary['wall_seconds'] / 3600:.1f} h of wall clock",
        highlight=False,
    )


def record(campaign: Path, everything: bool, console: Console) -> None:
    """Record the campaign's finished stages in its dvc.lock (``aclpipe.study.campaign.record``)."""
    import time

    from aclpipe.study.campaign import record as recording

    spec = load_campaign(campaign)
    started = time.perf_counter()
    names, waiting = recording.record(spec, everything)
    what = "re-recorded" if everything else "recorded"
    console.print(
        f"{what} {len(names)} stages in {spec.root / recording.LOCK} "
        f"({time.perf_counter() - started:.0f} s); {waiting} wait for their runs"
        + ("" if names else ": nothing new to record"),
        highlight=False,
    )


def report(campaign: Path, reports: Path, console: Console) -> None:
    """tuning.md, results.{md,json} and plots per task, and reports/README.md."""
    from aclpipe.study.campaign.markdown import campaign_reports
    from aclpipe.study.campaign.report import write_reports
    from aclpipe.study.campaign.tuning import TUNING_MD, write_tuning

    spec = load_campaign(campaign)
    if spec.fewshot:  # a few-shot study: its own report (reports/fewshot/)
        from aclpipe.study.fewshot.report import write_fewshot_report

        for path in write_fewshot_report(spec, reports):
            console.print(f"wrote {path}", highlight=False)
        return
    tuned = write_tuning(spec, reports)
    for name in tuned:
        console.print(f"wrote {campaign_reports(reports, name) / TUNING_MD}", highlight=False)
    summaries = write_reports(spec, reports, tuned)
    if not summaries:
        raise UserError(
            f"no finished runs under {spec.layout.runs()}: run `dvc repro campaign/dvc.yaml` "
            "(or `aclpipe campaign run ...`) first"
        )
    for task, summary in summaries.items():
        console.print(
            f"wrote {campaign_reports(reports, task) / RESULTS_MD} ({summary['finished']} runs)",
            highlight=False,
        )
    console.print(f"wrote {reports / REPORTS_README}", highlight=False)
