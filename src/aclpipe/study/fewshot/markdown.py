"""reports/fewshot/README.md: the few-shot study's tables and verdicts, from the summaries of
``report`` (scores x100 here). Every figure in it is recomputed from the run folders."""

from __future__ import annotations

from aclpipe.data.tasks import get_task
from aclpipe.layout import FEWSHOT_PEERS_PNG, FEWSHOT_SCORES_PNG, FEWSHOT_SPREAD_PNG
from aclpipe.study.campaign.plan import Campaign
from aclpipe.study.fewshot.provenance import recipe_lines, stacks_lines, wallclock_lines


def _pts(x: float | None, signed: bool = False) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def _interval(row: dict, signed: bool = True) -> str:
    if row.get("low") is None:
        return ""
    return f"[{_pts(row['low'], signed)}, {_pts(row['high'], signed)}]"


def _scores_table(campaign: Campaign, cells: list[dict], task: str) -> list[str]:
    bases = list(dict.fromkeys(run for run, _ in campaign.fewshot_runs.values()))
    lines = [
        "| N | " + " | ".join(bases) + " | majority class |",
        "| --- | " + " | ".join("---" for _ in bases) + " | --- |",
    ]
    for cell in (c for c in cells if c["task"] == task):
        row = [str(cell["n"])]
        for run in bases:
            e = cell["runs"].get(run)
            if e is None:
                row.append("not run yet" if run in cell.get("bases", [run]) else "")
                continue
            sd = f" ± {_pts(e['sd'])}" if e["sd"] is not None else ""
            on = _said(_MAJORITY_MARK.get(e["vs_majority"]["verdict"], ""), task)
            draws = f"{e['n']} draw{'s' if e['n'] > 1 else ''}"
            row.append(f"{_pts(e['mean'])}{sd} {_interval(e, False)}, {draws}{on}")
        row.append(_pts(cell.get("majority")))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _partial(draws: int, planned: int) -> str:
    """A verdict's mark where it rests on fewer draws than planned."""
    if draws == 1:
        return " (1 draw: examples only)"
    return f" (provisional: {draws} of {planned} draws)" if draws < planned else ""


def _claims_table(cells: list[dict], task: str, planned: int) -> list[str]:
    from aclpipe.study.fewshot.peers import holds_cell

    lines = [
        "| N | claim | question | A - B | 95% interval | p (one-sided) | Holm p | draws | "
        "verdict | holds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cell in (c for c in cells if c["task"] == task):
        for row in cell.get("claims", []):
            if "difference" not in row:
                cols = f"{cell['n']} | {row['claim']} | {row['question']}"
                lines.append(f"| {cols} | | | | | | {row['verdict']} | |")
                continue
            question = row["question"]
            if "rule_altered" in row:  # docs/claims.md A3: testable only where the rule fires
                question += f"; the rule altered {100 * row['rule_altered']:.1f}% of steps"
            holm = (
                f"{_p(row['holm_p'])} ± {row['holm_mc_error']:.3f}" if "holm_p" in row else ""
            )
            lines.append(
                f"| {cell['n']} | {row['claim']} | {question} | {_pts(row['difference'], True)} "
                f"| {_interval(row)} | {_p(row['p'])} | {holm} | {len(row['seeds'])} | "
                f"{row['verdict']}{_partial(len(row['seeds']), row.get('planned', planned))} | "
                f"{holds_cell(row)} |"
            )
    return lines


def _spread_table(cells: list[dict], task: str, planned: int) -> list[str]:
    lines = [
        "| N | question | sd A | sd B | ratio A / B | 95% interval | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cell in (c for c in cells if c["task"] == task):
        for row in cell.get("spreads", []):
            if "sd_a" not in row:
                lines.append(f"| {cell['n']} | {row['question']} | | | | | {row['verdict']} |")
                continue
            ratio = "n/a" if row["ratio"] is None else f"{row['ratio']:.2f}"
            interval = "" if row["low"] is None else f"[{row['low']:.2f}, {row['high']:.2f}]"
            lines.append(
                f"| {cell['n']} | {row['question']} | {_pts(row['sd_a'])} | {_pts(row['sd_b'])} "
                f"| {ratio} | {interval} | {row['verdict']}{_partial(len(row['draws']), planned)} |"
            )
    return lines


def _glance_claim(row: dict, planned: int) -> str:
    """One claim in a few words: ``+1.8 better, holds``; ``(not after Holm)`` where the verdict
    does not survive Holm's step-down over the task's claims."""
    if "difference" not in row:
        return row["verdict"]
    text = f"{_pts(row['difference'], True)} {row['verdict']}" + (", holds" if row["holds"] else "")
    if row["verdict"] in ("better", "worse", "comparable") and not row.get("family_wise"):
        text += " (not after Holm)"
    draws, planned = len(row["seeds"]), row.get("planned", planned)
    return text + (f" ({draws} of {planned} draws)" if draws < planned else "")


def _glance_spread(row: dict, planned: int) -> str:
    """One spread ratio in a few words: ``1.18 [0.96, 1.47] inconclusive``."""
    if "sd_a" not in row or row["ratio"] is None:
        return row["verdict"]
    interval = "" if row["low"] is None else f" [{row['low']:.2f}, {row['high']:.2f}]"
    draws = len(row["draws"])
    late = f" ({draws} of {planned} draws)" if draws < planned else ""
    return f"{row['ratio']:.2f}{interval} {row['verdict']}{late}"


def _glance(cells: list[dict], planned: int) -> list[str]:
    """Every verdict on one screen: a row per (task, N), a column per claim (A - B in points and
    its verdict; S2's ratio of sds). The per-task sections below give the intervals and p."""
    first = next((c for c in cells if c.get("claims")), None)
    if first is None:
        return []
    claims = [(r["claim"], r["a"], r["b"]) for r in first["claims"]]
    spreads = [(r["claim"], r["a"], r["b"]) for r in first.get("spreads", [])]
    head = [f"{c} {a} - {b}" for c, a, b in claims] + [f"{c} sd {a} / {b}" for c, a, b in spreads]
    lines = [
        "| task | N | " + " | ".join(head) + " |",
        "| --- | --- |" + " --- |" * len(head),
    ]
    for cell in cells:
        if not cell.get("claims"):
            continue
        row = [cell["task"], str(cell["n"])]
        found = {(r["claim"], r["a"], r["b"]): r for r in cell["claims"]}
        row += [_glance_claim(found[k], planned) if k in found else "" for k in claims]
        found = {(r["claim"], r["a"], r["b"]): r for r in cell.get("spreads", [])}
        row += [_glance_spread(found[k], planned) if k in found else "" for k in spreads]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _majority_table(campaign: Campaign, cells: list[dict], task: str) -> list[str]:
    bases = list(dict.fromkeys(run for run, _ in campaign.fewshot_runs.values()))
    lines = ["| N | " + " | ".join(bases) + " |", "| --- |" + " --- |" * len(bases)]
    for cell in (c for c in cells if c["task"] == task):
        row = [str(cell["n"])]
        for run in bases:
            e = cell["runs"].get(run)
            v = e["vs_majority"] if e else None
            row.append(
                ("not run yet" if run in cell.get("bases", [run]) else "") if v is None
                else f"{_pts(v['difference'], True)} {_interval(v)} {_said(v['verdict'], task)}"
            )  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return lines


# a method against its draws' majority-class guess (report.against_majority): better,
# on it (not told apart) or below it (the interval lies under 0)
ON, BELOW = "on the majority class", "below the majority class"
# S2's fewest draws: with k draws, k of the k^k equally likely resamples of the draws repeat one
# draw (both sds 0, the ratio undefined): 11% at 3, past the 2.5% a 95% interval can leave
# out; 1.6% at 4
SPREAD_DRAWS = 4
_MAJORITY_MARK = {ON: " (on majority)", BELOW: " (below majority)"}  # the score table's cells


def _floor(task: str) -> str:
    """What a constant guess is on the task: under Matthews correlation every prediction that
    ignores the input scores 0, chance, whichever class it guesses."""
    return "chance (MCC 0)" if "mcc" in get_task(task).metrics else "the majority class"


def _said(text: str, task: str) -> str:
    """``text`` about the majority class, worded for the task (``_floor``)."""
    if "mcc" not in get_task(task).metrics:
        return text
    for majority, chance in (("on the majority class", "at chance"), ("on majority", "at chance"),
                             ("the majority class", "chance"), ("majority", "chance")):  # fmt: skip
        text = text.replace(majority, chance)
    return text


def _on_majority(cells: list[dict]) -> list[str]:
    """One line per (task, N) where some method does not beat the majority class: on it (not
    told apart) or below it (the interval lies under it)."""
    out = []
    for cell in cells:
        verdict = {r: e["vs_majority"]["verdict"] for r, e in cell["runs"].items()}
        failing = [r for r, v in verdict.items() if v != "better"]
        if not failing:
            continue
        every = len(failing) == len(cell["runs"])
        below = [r for r in failing if verdict[r] == BELOW]
        floor = _floor(cell["task"])
        where = floor if "MCC" in floor else f"{floor} ({_pts(cell['majority'])})"
        out.append(
            f"- {cell['task']} at N = {cell['n']}: {'every method' if every else ', '.join(failing)} "
            f"at or below {where}"
            + (f"; {', '.join(below)} below it" if below else "")
            + (": its comparisons are uninformative" if every else "")
        )
    return out


def fewshot_markdown(campaign: Campaign, cells: list[dict], clock: dict | None = None) -> str:
    """The whole README: how the study runs and judges, the recipe and figures, the verdicts at
    a glance, the peers, where a method does not beat the majority class, the wall clock, the
    stacks, and every task's tables."""
    from aclpipe.study.fewshot.peers import peer_section, regime_section, s2_power_section

    finished = sum(c["finished"] for c in cells)
    lines = [
        *_intro(campaign, cells, finished),
        "## Verdicts at a glance",
        "",
        "A - B in points (x100) with its verdict, and whether the claim holds as its paper words "
        "it; \"not after Holm\" where the verdict does not survive Holm's step-down over the "
        "task's judged claims (its adjusted p exceeds the level); S2: the ratio of the sds over draws [95% interval]. "
        "The sections per task below give every interval and p.",
        "",
        *_glance(cells, len(campaign.seeds)),
        "",
        *peer_section(campaign, cells),
        *s2_power_section(campaign, cells),
        *regime_section(campaign, cells),
        "## Where a method does not beat the majority class",
        "",
        *(_on_majority(cells) or ["- nowhere: every method beats the majority class at every N"]),
        "",
        *wallclock_lines(campaign, clock, finished),
        *stacks_lines(cells),
    ]
    for task in campaign.tasks:
        lines += _task_section(campaign, cells, task)
    return "\n".join(lines)


def _intro(campaign: Campaign, cells: list[dict], finished: int) -> list[str]:
    """The title, the runs done, how a run trains and a claim is judged, the recipe, figures."""
    planned, rules = sum(c["planned"] for c in cells), campaign.verdicts
    fewer = SPREAD_DRAWS - 1  # the draws at which S2 has no interval
    return [
        "# Few-shot: SCL's claims in their own regime, and ACL beside them",
        "",
        f"Runs done: {finished} of {planned} ({len(campaign.seeds)} draws planned per task, N "
        "and method, 30 for ce and scl on SST-2 at N = 20 and 100 (campaign.cells); a row over "
        "fewer draws is partial, its verdict provisional). Generated by "
        f"`aclpipe campaign report --campaign {campaign.path}` from {campaign.layout.runs()}/ "
        "(do not edit by hand).",
        "",
        "Each run trains `all-MiniLM-L6-v2` (single exit; cosine-pairs has a head at every "
        "layer and is judged at its last) on a class-stratified draw of N "
        "examples of the task's training split, drawn after the campaign's validation split is "
        "held out; a draw is one seed (the draw and the training share it), every method of a "
        "seed trains on the same draw (its ids are in each run.json), and every run is scored "
        "once on the full dev set. Scores x100; CoLA's is Matthews correlation (its majority "
        "class scores 0).",
        "",
        "How a claim is judged, as the campaign judges its own (reports/README.md; "
        "../../src/aclpipe/study/stats/verdicts.py), under campaign.verdicts of "
        f"{campaign.path}: the paired bootstrap over draws and dev examples "
        f"({rules.resamples:,} resamples), on the draws both runs have, gives A - B with its "
        "95% interval and three one-sided tests. **better** / **worse** when the tail beyond 0 "
        f"is at most {100 * rules.alpha:g}%; **comparable** when, not better, A is no worse than "
        f"B by {100 * rules.margin:g} point (the margin fixed in advance); **inconclusive** "
        "otherwise; the p shown is the verdict's own. A claim **holds** as its paper words it: "
        "one that A beats or helps B when better, one that A \"outperforms or performs "
        "comparably\" when better or comparable; the tables' holds column also asks it of "
        "the Holm-adjusted p (\"no (not after Holm)\" where only the claim's own p is at "
        "most the level). **uninformative** when neither run beats its "
        "draws' majority class; A3 is **rule not exercised** where ACL-Grad's rule altered "
        f"under {100 * rules.rule_floor:g}% of the steps. Holm p: Holm's step-down over a "
        "task's judged claims at every N, ± its Monte Carlo error. A1 is the ACL paper's claim "
        "on full training sets with BERT-base and RoBERTa (../../docs/claims.md): here it "
        "is tested outside that regime. Spread (S2): the ratio of the sds over draws with a "
        "bootstrap interval from the same resamples; **lower** when it lies below 1, "
        "**uninformative** unless A beats the majority class (a method that guesses one class "
        f"varies little without being steadier); it needs {SPREAD_DRAWS} draws (with {fewer}, "
        f"{fewer / fewer**fewer:.0%} of the resamples repeat one draw and have no sd). A row over "
        "fewer draws than planned is "
        "**provisional**.",
        "",
        "## Recipe",
        "",
        *recipe_lines(campaign),
        "",
        f"![score against N]({FEWSHOT_SCORES_PNG})",
        "",
        f"![spread over draws]({FEWSHOT_SPREAD_PNG})",
        "",
        *([f"![the methods beside SetFit and the linear probe]({FEWSHOT_PEERS_PNG})", ""]
          if any("peers" in c for c in cells) else []),  # fmt: skip
    ]


def _task_section(campaign: Campaign, cells: list[dict], task: str) -> list[str]:
    """One task: its scores, claims, spreads and margins over the majority class."""
    draws = len(campaign.seeds)
    if not any(c["runs"] for c in cells if c["task"] == task):
        return [f"## {task}", "", "No finished run yet.", ""]
    return [
        f"## {task}",
        "",
        "Dev score: mean ± sd over draws [95% interval].",
        "",
        *_scores_table(campaign, cells, task),
        "",
        "Claims (final exit):",
        "",
        *_claims_table(cells, task, draws),
        "",
        "Spread over draws (S2; the sds over the draws both methods have, where the score "
        "table's are over each method's own):",
        "",
        *_spread_table(cells, task, draws),
        "",
        f"Against {_floor(task)}: the method's score minus that of a constant guess of its "
        "draws' majority class, 95% interval:",
        "",
        *_majority_table(campaign, cells, task),
        "",
    ]
