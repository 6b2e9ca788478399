"""The trade-off report's tables (console and Markdown) and its warnings.

``budget_lines`` prints the budget table in a terminal's width (one line per cell);
``render_budget_table`` and ``render_exit_table`` print everything with rich (``tradeoff
--full``); ``markdown`` writes both as ``tradeoff.md``. Beside every table: the majority-class score; a method whose full model is at
or below it is marked ``(≤ majority)``, a budget whose floor is at or below it
``(floor ≤ majority)``, a measured speed-up above its layer bound ``*``, and too few timed
examples are said (``aclpipe.evaluation.caveats``); ``warnings`` says each in one line. Measured
speed-ups are labelled by engine (``caveats.ENGINES_NOTE``): ``torch``, ``onnx`` and
``onnx/torch-full``, each at batch 1 / 32, "-" when not measured.
"""

from __future__ import annotations

from rich.table import Table

from aclpipe.evaluation import caveats


def _name(report: dict, method: str) -> str:
    return f"{report['task']}/{method}"


def _low_methods(report: dict, summary: dict) -> list[str]:
    """Methods whose full model scores at or below the majority-class score."""
    return [m for m, metrics in summary.items()
            if caveats.at_or_below(metrics["final_score"], report["majority"])]  # fmt: skip


def _low_budgets(report: dict) -> list[int]:
    """Budgets whose floor (reference minus b points) is at or below the majority score."""
    return [b for b in report["budgets"]
            if caveats.at_or_below(round(report["reference"] - b / 100, 10), report["majority"])]  # fmt: skip


# (field, label in a warning, batch size) of the speed-ups a layer bound applies to
_BOUNDED = [(f"{prefix}_batch{size}", label, size)
            for prefix, label in caveats.BOUNDED_SPEEDUPS for size in (1, 32)]  # fmt: skip
# (label in a cell, field prefix, bounded): the measured speed-ups of a cell, per engine
_ENGINES = (("torch", "measured_speedup", True), ("onnx", "onnx_speedup", True),
            ("onnx/torch-full", "onnx_vs_torch_full", False))  # fmt: skip


def _noisy(row: dict, field: str) -> bool:
    return caveats.is_noise(row.get(field), row.get("speedup_bound"))


ON_DEV = (
    "settings chosen on dev, the split that scores them (some method has no validation sweep), "
    "so these speed-ups are optimistic: prepare with data.validation_fraction > 0 and rerun "
    "evaluate to choose on validation"
)


def warnings(report: dict, summary: dict) -> list[str]:
    """One line per method at or below the floor, per budget whose floor is at or below it,
    per method timed on too few examples and per method with noisy speed-ups in the table."""
    majority, lines = report["majority"], []
    if report.get("validation_reference") is None:
        lines.append(f"warning: {report['task']}: {ON_DEV}")
    for method in _low_methods(report, summary):
        lines.append(caveats.final_warning(_name(report, method),
                                           summary[method]["final_score"], majority, "full model",
                                           "its"))  # fmt: skip
    for budget in _low_budgets(report):
        floor = round(report["reference"] - budget / 100, 10)
        lines.append(caveats.budget_warning(report["task"], _budget_name(budget), floor, majority))
    for method, examples in report["timing"].items():
        if caveats.too_few_timed(examples):
            lines.append(caveats.few_timed_warning(_name(report, method), examples))
        flagged = {(_setting(r) + label, size, r[field], r["speedup_bound"])
                   for r in report["rows"] if r["method"] == method and r["policy"] is not None
                   for field, label, size in _BOUNDED if _noisy(r, field)}  # fmt: skip
        if flagged:
            timed = caveats.timing_note(examples)
            lines.append(caveats.noise_warning(_name(report, method), sorted(flagged), timed))
    return lines


def _speedup(value: float | None, noisy: bool = False) -> str:
    return "-" if value is None else f"{value:.2f}×" + (caveats.NOISE_MARK if noisy else "")


def _setting(row: dict) -> str:
    if row["policy"] == "full":
        return "full model"
    return f"{row['policy']}@{row['threshold']:g}"


def _budget_name(budget: int) -> str:
    return "no drop" if budget == 0 else f"≤ {budget} pt{'s' if budget != 1 else ''} drop"


_LOW_BUDGET = " (floor ≤ majority)"
_MISSED_ON_DEV = ", under the budget on dev"  # chosen on validation, below ce's dev score - b
_LOW_METHOD = " (≤ majority)"


def _budget_header(report: dict) -> list[str]:
    low = _low_budgets(report)
    return [_budget_name(b) + (_LOW_BUDGET if b in low else "") for b in report["budgets"]]


def method_names(report: dict, summary: dict) -> dict[str, str]:
    low = _low_methods(report, summary)
    return {m: m + (_LOW_METHOD if m in low else "") for m in report["exit_scores"]}


def _majority_line(report: dict) -> str:
    majority = report["majority"]
    if majority is None:
        return ("majority-class score: not recorded (metrics.json predates it: run "
                "`aclpipe evaluate` again)")  # fmt: skip
    return (f"majority-class score {100 * majority:.2f} (x100; every example given the most "
            "frequent train label; STS-B: 0)")  # fmt: skip


def _marks_note(report: dict) -> str:
    """What each mark in the tables means, for the marks they hold ("" when none)."""
    notes = []
    if any(name.endswith(_LOW_METHOD) for name in report["names"].values()):
        notes.append(f"{_LOW_METHOD.strip()} after a method: its full model scores at or below "
                     "the majority-class score")  # fmt: skip
    if _low_budgets(report):
        notes.append(f"{_LOW_BUDGET.strip()} on a budget: its floor is at or below the "
                     "majority-class score, so a constant guess meets it")  # fmt: skip
    if any(r.get("met_on_dev") is False for r in report["rows"]):
        notes.append(f"({_MISSED_ON_DEV.removeprefix(', ')}) after a score: the setting, chosen on "
                     "validation within the budget, scores on dev below ce's dev score minus the "
                     "budget")  # fmt: skip
    if any(_noisy(r, field) for r in report["rows"] if r["policy"] for field, _, _ in _BOUNDED):
        notes.append(caveats.NOISE_FOOTNOTE)
    return " ".join(f"{n}." for n in notes)


def _measured(row: dict) -> list[str]:
    """``torch 1.70× / 1.90×``, then onnx and onnx/torch-full: batch 1 / 32 per engine."""
    return [
        f"{label} " + " / ".join(
            _speedup(row.get(f := f"{prefix}_batch{size}"), bounded and _noisy(row, f))
            for size in (1, 32)
        )
        for label, prefix, bounded in _ENGINES
    ]  # fmt: skip


def _cells(report: dict, method: str, sep: str) -> list[str]:
    """Per budget: layer speed-up (score x100), measured batch 1 / 32 per engine, the setting;
    or "-"."""
    rows = [r for r in report["rows"] if r["method"] == method]
    return [
        "-"
        if r["policy"] is None
        else sep.join([f"{_speedup(r['layer_speedup'])} ({100 * r['score']:.2f}"
                       f"{_MISSED_ON_DEV if r.get('met_on_dev') is False else ''})",
                       *_measured(r), _setting(r)])
        for r in rows
    ]  # fmt: skip


def render_budget_table(report: dict) -> Table:
    """Rich table: rows methods, one column per budget; the floor and marks in the caption."""
    table = Table(
        title=f"{report['task']}: best speed-up within a score budget "
        f"(reference ce {100 * report['reference']:.2f}; {_majority_line(report)})",
        caption="each cell: layer speed-up (score x100) / measured speed-ups, batch 1 / 32, "
        f"per engine / setting ({caveats.ENGINES_NOTE}; - not measured); speed-ups "
        f"{caveats.timing_note(_timed(report))}. {_marks_note(report)}",
    )
    names = report["names"]
    table.add_column("method")
    for header in _budget_header(report):
        table.add_column(header, justify="right")
    for method in report["exit_scores"]:
        table.add_row(names[method], *_cells(report, method, "\n"))
    return table


def _deployed(report: dict) -> tuple[str, str]:
    """``(label, field prefix)`` of the engine ``predict`` serves on: ONNX Runtime's early exit
    over its own full model where it was timed, else PyTorch's."""
    timed = any(r.get("onnx_speedup_batch1") is not None for r in report["rows"])
    return ("onnx", "onnx_speedup") if timed else ("torch", "measured_speedup")


_SHORT_BUDGET = {0: "no drop"}
_MISSED_MARK = "†"  # the short form of _MISSED_ON_DEV


def budget_lines(report: dict) -> list[str]:
    """The budget table for a terminal: one line per method and budget, what a reader decides
    on (layer speed-up, score x100, the deployable engine's measured speed-up at batch 1 / 32,
    the setting), aligned; ``markdown`` and ``render_budget_table`` keep every engine and mark.
    A method at or below the majority-class score keeps its name plain here: its warning line
    says so."""
    label, prefix = _deployed(report)
    header = ["method", "budget", "layer", "score", f"{label} b1 / b32", "setting"]
    rows = []
    for r in report["rows"]:
        budget = _SHORT_BUDGET.get(r["budget_points"], f"≤ {r['budget_points']} pt"
                                   + ("s" if r["budget_points"] != 1 else ""))  # fmt: skip
        if r["policy"] is None:
            rows.append([r["method"], budget, "-", "-", "-", "no setting meets it"])
            continue
        missed = _MISSED_MARK if r.get("met_on_dev") is False else ""
        measured = " / ".join(
            _speedup(r.get(f := f"{prefix}_batch{size}"), _noisy(r, f)) for size in (1, 32)
        )
        rows.append([r["method"], budget, _speedup(r["layer_speedup"]),
                     f"{100 * r['score']:.2f}{missed}", measured, _setting(r)])  # fmt: skip
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    right = (False, False, True, True, True, False)

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w)
                         for c, w, r in zip(cells, widths, right)).rstrip()  # fmt: skip

    title = (f"{report['task']}: best speed-up within a score budget (reference ce "
             f"{100 * report['reference']:.2f})")  # fmt: skip
    notes = []
    if any(r.get("met_on_dev") is False for r in report["rows"]):
        notes.append(f"{_MISSED_MARK} under the budget on dev")
    if any(_noisy(r, f"{prefix}_batch{size}") for r in report["rows"] for size in (1, 32)):
        notes.append(f"{caveats.NOISE_MARK} timing noise")
    return [title, line(header), *(line(row) for row in rows), *(["; ".join(notes)] * bool(notes))]


def _timed(report: dict) -> int | None:
    """The fewest examples any method was timed on (what the table's speed-ups rest on)."""
    counts = [n for n in report.get("timing", {}).values() if n]
    return min(counts) if counts else None


def _exit_header(report: dict) -> list[str]:
    return ["method", *(f"L{k}" for k in range(1, report["num_layers"] + 1)), "final", "avg"]


def _exit_cells(report: dict, metrics: dict, method: str) -> list[str]:
    """Score x100 per layer 1..L (blank where there is no exit), final, average over exits."""
    scores = report["exit_scores"][method]
    layers = range(1, report["num_layers"] + 1)
    cells = [f"{100 * scores[k]:.2f}" if k in scores else "" for k in layers]
    return [*cells, *(f"{100 * metrics[f]:.2f}" for f in ("final_score", "average_over_exits"))]


def render_exit_table(report: dict, summary: dict) -> Table:
    """Rich table: rows methods, columns layers 1..L (blank where no exit), final, average."""
    table = Table(
        title=f"{report['task']}: dev score per exit layer (x100; avg over exits)",
        caption=_majority_line(report),
    )
    for i, name in enumerate(_exit_header(report)):
        table.add_column(name, justify="right" if i else "left")
    names = report["names"]
    for method, metrics in summary.items():
        table.add_row(names[method], *_exit_cells(report, metrics, method))
    return table


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _reference_note(report: dict) -> str:
    dev = f"{100 * report['reference']:.2f}"
    if report.get("validation_reference") is None:
        return (f"Reference: the full ce model's dev score, {dev} (x100). A budget of b points "
                "admits every setting scoring at least reference - b on dev.")  # fmt: skip
    return (f"Settings are chosen on the validation split: a budget of b points admits every "
            f"setting whose validation score is at least the full ce model's, "
            f"{100 * report['validation_reference']:.2f}, minus b; each cell gives the chosen "
            f"setting's dev figures (dev reference: ce {dev}), so a cell may miss its budget on "
            "dev.")  # fmt: skip


def markdown(report: dict, summary: dict, timing_examples: int | None) -> str:
    """Both tables as Markdown, with the reference and how the speed-ups are measured."""
    on = f" on {timing_examples} dev examples" if timing_examples else ""
    names = report["names"]
    budgets = _md_table(
        ["method", *_budget_header(report)],
        [[names[m], *_cells(report, m, "; ")] for m in report["exit_scores"]],
    )
    exits = _md_table(
        _exit_header(report),
        [[names[m], *_exit_cells(report, metrics, m)] for m, metrics in summary.items()],
    )
    missing = "".join(f"\nNo results for {m}.\n" for m in report["missing"])
    majority = f"{_majority_line(report)[0].upper()}{_majority_line(report)[1:]}."
    timed = f"Speed-ups {caveats.timing_note(_timed(report))}."
    notes = "".join(f"\n- {line.removeprefix('warning: ')}" for line in report["warnings"])
    notes = f"\nWarnings:\n{notes}\n" if notes else ""
    return (
        f"# {report['task']}: speed-up within a score budget\n\n"
        f"{_reference_note(report)}\n\n"
        "Each cell: layer speed-up (score x100); measured speed-up at batch 1 / batch 32 per "
        "engine (torch, onnx, onnx/torch-full); the setting (policy@threshold, or the full "
        "model); - when no setting meets the budget, or for a speed-up not measured.\n\n"
        f"Layer speed-up = 1 / expected time ratio (layers run / all layers); measured speed-up = "
        f"a wall-clock time ratio{on}, median of repeats after a warm-up, all engines "
        f"interleaved; {caveats.ENGINES_NOTE}.\n\n"
        f"{majority} {timed} {_marks_note(report)}\n{notes}\n"
        f"{budgets}\n{missing}\n## Dev score per exit layer (x100; avg: over exits)\n\n"
        f"{majority}\n\n{exits}\n"
    )
