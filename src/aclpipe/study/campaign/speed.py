"""The speed side of the campaign report: each run's speed-up within quality budgets over
its seeds, and its mean dev score-against-cost curve (docs/methods.md, "How a claim is judged", Budgets);
figures from the run folders' per-example outputs (``measures``), and their markdown."""

from __future__ import annotations

import statistics

import numpy as np

from aclpipe.early_exit.budget import BUDGETS
from aclpipe.evaluation import caveats
from aclpipe.study.stats import measures as scoring

BUDGET_REFERENCE = "ce"  # budgets count from this run's full model, seed by seed
COST_GRID = 41  # costs at which each seed's dev curve is read, to average curves over seeds
BELOW = "†"
BELOW_NOTE = (
    f"{BELOW} for some seed the budget's floor (the reference's validation or dev score minus "
    "b points) is at or below the majority-class score, so a constant guess would pass it, or "
    "the picked setting's dev score is at or below the majority-class score"
)


def references(found: dict[str, dict[int, dict]]) -> dict[int, tuple[float, float]]:
    """Per seed, ``BUDGET_REFERENCE``'s final-exit (validation, dev) scores."""
    return {
        s: scoring.final_scores(r["outputs"])
        for s, r in found.get(BUDGET_REFERENCE, {}).items()
        if r["outputs"].validation_logits is not None
    }


def budgets(by_seed: dict, majority: dict, refs: dict) -> dict[str, dict]:
    """Every budget's cell (``BUDGETS``) of one run over its table seeds."""
    return {str(b): _budget(by_seed, b, majority, refs) for b in BUDGETS}


def over_seeds(values: list[float]) -> dict:
    """Mean, sample sd (None for one value) and count of per-seed values."""
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else None,
        "n": len(values),
    }


def _budget(by_seed: dict, budget: int, majority: dict, references: dict) -> dict:
    """One budget cell over the seeds: each seed's pick counted from ce's scores of that seed
    (the run's own where ce lacks the seed). The speed-up is the inverse of the mean dev time
    ratio over seeds (a mean of per-seed speed-ups would let one seed that exits everything at
    layer 1 swamp the rest); the per-seed speed-ups' range is kept beside it."""
    picks = {
        s: scoring.budget_pick(r["outputs"], budget, references.get(s))
        for s, r in sorted(by_seed.items())
    }
    floor_below = any(
        caveats.at_or_below(p["validation_floor"], majority.get("validation"))
        or caveats.at_or_below(p["dev_floor"], majority.get("dev"))
        for p in picks.values()
    )
    pick_below = any(
        caveats.at_or_below(p["dev_score"], majority.get("dev")) for p in picks.values()
    )
    ratios = [p["dev_time_ratio"] for p in picks.values()]
    speedups = [p["dev_speedup"] for p in picks.values()]
    return {
        "speedup": 1.0 / statistics.fmean(ratios),
        "speedup_range": [min(speedups), max(speedups)],
        "time_ratio": over_seeds(ratios),
        "dev_score": over_seeds([p["dev_score"] for p in picks.values()]),
        "met": sum(p["met"] for p in picks.values()),
        "admitted": sum(p["admitted"] for p in picks.values()),
        "seeds": len(picks),
        "own_reference": sum(p["reference"] == "own" for p in picks.values()),
        "below_majority": floor_below or pick_below,
        "floor_below_majority": floor_below,
        "pick_below_majority": pick_below,
        "by_seed": {str(s): p for s, p in picks.items()},
    }


def cost_curve(task, by_seed: dict) -> dict:
    """Each seed's dev points of its validation-frontier settings, and the mean over seeds of
    the curves through them (read at ``COST_GRID`` costs, flat beyond the end points)."""
    points, curves = {}, []
    for seed, r in sorted(by_seed.items()):
        outputs = r["outputs"]
        m = scoring.measure(outputs, "auc")
        ones = np.ones(len(outputs.dev_labels))
        scores = scoring.weighted_scores(task, m.predictions, outputs.dev_labels, ones)[0]  # [S]
        costs = m.layers.mean(axis=1) / outputs.num_layers
        order = np.lexsort((scores, costs))
        points[str(seed)] = {"costs": costs[order].tolist(), "scores": scores[order].tolist()}
        grid = np.linspace(*m.cost_range, COST_GRID)
        curves.append(np.interp(grid, costs[order], scores[order]))
    return {"points": points, "costs": grid.tolist(), "scores": np.mean(curves, axis=0).tolist()}


# --- markdown ---------------------------------------------------------------------------------


def cell_text(cell: dict) -> str:
    """``1.69x (1.19-5.95); 80.1 ± 1.2; met 1/3; no pick 1/3 †``."""
    low, high = cell["speedup_range"]
    spread = f" ({low:.2f}-{high:.2f})" if cell["seeds"] > 1 else ""
    score = cell["dev_score"]
    score_sd = f" ± {100 * score['sd']:.1f}" if score["sd"] is not None else ""
    none = cell["seeds"] - cell["admitted"]
    no_pick = f"; no pick {none}/{cell['seeds']}" if none else ""
    mark = f" {BELOW}" if cell["below_majority"] else ""
    return (
        f"{cell['speedup']:.2f}x{spread}; {100 * score['mean']:.1f}{score_sd}; "
        f"met {cell['met']}/{cell['seeds']}{no_pick}{mark}"
    )


def intro(summary: dict) -> str:
    reference = summary.get("budget_reference")
    if reference:
        whom = (
            f"the reference is {reference}'s full model of the same seed (the baseline a "
            "faster model must stay near; a run's own full model only where "
            f"{reference} lacks the seed)"
        )
    else:
        whom = "the reference is the run's own full model (the campaign has no ce run)"
    return (
        f"Per seed, {whom}. A budget of b points admits the settings scoring at least the "
        "reference's *validation* score - b on validation; the cheapest of them on validation "
        "(ties: the better score) is picked, and where none is admitted, the run's full model "
        '(no early exit, 1.00x; counted as "no pick"). Reported on *dev*: the layer speed-up '
        "(layers over the mean exit layer, averaged over seeds as the inverse of the mean time "
        "ratio; per-seed range in brackets), the dev score (mean ± sd over seeds), and how many "
        "seeds' dev score met the reference's dev score - b. Every table seed counts. Measured "
        "wall-clock speed-ups are benchmarks/early_exit_speed.py's job."
    )


def section(summary: dict, multi: dict[str, dict]) -> tuple[str, list[str], list[list[str]], str]:
    """The budget section's intro, table header and rows, and the note under it ("" if none);
    an intro alone where no run has budgets (no validation split)."""
    budgeted = {run: e for run, e in multi.items() if "budgets" in e}
    if not budgeted:
        return (
            "Not available: the runs have no validation split, where the exit settings are "
            "chosen (set data.validation_fraction, prepare and rerun).",
            [], [], "",
        )  # fmt: skip
    header = ["run", *(f"budget {b} point{'s' if b != 1 else ''}" for b in BUDGETS)]
    rows = [
        [run, *(cell_text(e["budgets"][str(b)]) for b in BUDGETS)]
        for run, e in budgeted.items()
    ]
    marked = any(c["below_majority"] for e in budgeted.values() for c in e["budgets"].values())
    return intro(summary), header, rows, BELOW_NOTE + "." if marked else ""
