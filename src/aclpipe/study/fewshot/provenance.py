"""How the few-shot study's runs were made, for reports/fewshot/README.md: the recipe every
method shares, what the runs cost in wall clock (``wallclock.summarise``), and the stacks they
ran on."""

from __future__ import annotations

import collections

from aclpipe.study.campaign.plan import Campaign
from aclpipe.study.fewshot.wallclock import LEDGER


def recipe_lines(campaign: Campaign) -> list[str]:
    """The training recipe every method shares, and the steps at each N."""
    train, methods = campaign.base["train"], campaign.base["methods"]  # every value, filled in
    lines = ["| N | epochs | optimisation steps |", "| --- | --- | --- |"]
    for n in campaign.fewshot:
        params = campaign.params(campaign.tasks[0], next(
            r for r, (_, m) in campaign.fewshot_runs.items() if m == n), campaign.seeds[0])  # fmt: skip
        steps = params.train.epochs * -(-n // params.train.batch_size)
        lines.append(f"| {n} | {params.train.epochs} | {steps} |")
    # the knobs each method's runs set (scl's acl_grad is the scl-grad variant's, off here)
    shown = {"scl": ("tau", "lam"), "acl": ("tau", "lam", "acl_grad")}
    knobs = "; ".join(
        f"`{name}` "
        + ", ".join(
            f"{k} {str(v).lower() if isinstance(v, bool) else v}"
            for k, v in methods.get(name, {}).items()
            if k in keys
        )
        for name, keys in shown.items()
    )
    return [
        f"Same for every method ({campaign.path}; its header says when and why each setting "
        f"was fixed). Batch "
        f"{train.get('batch_size')}, lr {train.get('lr')} (heads {train.get('head_lr')}), "
        f"warm-up {train.get('warmup_ratio')} of the steps, weight decay "
        f"{train.get('weight_decay')}, clipping {train.get('max_grad_norm')}; {knobs}. "
        "No validation split: nothing is selected, dev is scored once per run.",
        "",
        *lines,
    ]


def wallclock_lines(campaign: Campaign, clock: dict | None, finished: int) -> list[str]:
    """What the runs cost: ``wallclock.summarise`` of <study>/wallclock.tsv."""
    if clock is None:
        return []
    untimed = finished - clock["runs"]
    return [
        "## Wall clock",
        "",
        f"From {campaign.root / LEDGER} (`aclpipe campaign wallclock --campaign {campaign.path}` "
        "after each batch of runs, from the checkout that ran them): "
        f"{clock['runs']} of the {finished} finished runs are timed"
        + (f" ({untimed} ran before the ledger, untimed)" if untimed > 0 else "")
        + f", {clock['first']} to {clock['last']} UTC. They took "
        f"{clock['run_seconds'] / 3600:.1f} h of run time (a run: its log's first to last "
        f"write; training, dev scoring and start-up) in {clock['wall_seconds'] / 3600:.1f} h of "
        "wall clock (the union of the runs' intervals: runs side by side count once, the "
        "idle time between runs not at all). The runs shared the machine with whatever else "
        "ran on it (tests, builds and benchmarks run beside them), so the runs of one cell "
        "differ in time: the table gives the fastest and the slowest.",
        "",
        "| N | task | runs timed | seconds a run: mean (fastest-slowest) | run time (h) |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {c['n']} | {c['task']} | {c['runs']} | {c['mean_seconds']:.0f} "
            f"({c['min_seconds']}-{c['max_seconds']}) | {c['run_seconds'] / 3600:.2f} |"
            for c in clock["cells"]
        ),
        "",
        *(
            f"- Corrected by hand: {r['task']} {r['run']} N = {r['n']} seed {r['seed']}, "
            f"{r['start_utc']} to {r['end_utc']}: {r['note']}"
            for r in clock.get("notes", [])
        ),
        *([""] if clock.get("notes") else []),
    ]


def stacks_lines(cells: list[dict]) -> list[str]:
    """Which stacks and CPUs the finished runs ran on, from their run.json."""
    counts: collections.Counter = collections.Counter()
    for cell in cells:
        counts.update(cell.get("stacks", {}))
    if not counts:
        return []
    unnamed = sum(n for name, n in counts.items() if name.startswith("cpu,"))
    return [
        "## Stacks",
        "",
        "From each run's run.json (`environment`):",
        "",
        *(f"- {name}: {n} run{'s' if n != 1 else ''}" for name, n in sorted(counts.items())),
        "",
        *(
            [
                f"{unnamed} of these CPU runs do not name their CPU (run.json names it from "
                "2026-12-05 on): the wall clock's times may come from more than one host.",
                "",
            ]
            if unnamed
            else []
        ),
    ]
