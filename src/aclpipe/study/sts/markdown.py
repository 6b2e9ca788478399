"""The STS study's README (reports/sts/README.md), rendered from ``sts_report.summarise``'s
summary (no statistics computed here, and nothing imported from it): a summary paragraph worded no stronger than the
verdicts, the scores, claim L2 on the STS Benchmark test (the family) and STS-B dev, and the
untrained checkpoint as context."""

from __future__ import annotations

import json

from aclpipe.study.stats.verdicts import stable
from aclpipe.study.sts.study import StsStudy

SPLIT_NAMES = {"test": "STS Benchmark test", "dev": "STS-B dev"}
DECIDED = ("better", "worse", "comparable")


def pts(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def signed(x: float) -> str:
    """x100, two decimals; two significant digits where that would print +0.00 for a value
    that is not 0 (a verdict turns on an interval end's sign)."""
    if x != 0 and abs(100 * x) < 0.005:
        return f"{100 * x:+.2g}"
    return f"{100 * x:+.2f}"


def interval(c: dict) -> str:
    """``+1.23 [+0.40, +2.05]``: a comparison's difference and 95% interval, in points."""
    return f"{signed(c['difference'])} [{signed(c['low'])}, {signed(c['high'])}]"


def few_seeds(seeds: list[int]) -> str:
    """What an interval over so few seeds does not hold: it resamples seeds too."""
    if len(seeds) == 1:
        return "1 seed: sentence pairs only"
    return "2 seeds only" if len(seeds) == 2 else ""


def seeds_text(seeds: list[int]) -> str:
    few = few_seeds(seeds)
    return ", ".join(map(str, seeds)) + (f" ({few})" if few else "")


def verdict_text(c: dict) -> str:
    """``**inconclusive** (no difference larger than 1.13 points)``."""
    text = f"**{c['verdict']}**"
    if c["verdict"] == "inconclusive":
        text += f" (no difference larger than {100 * c['detectable']:.2f} points)"
    return text


def p_text(c: dict) -> str:
    """The verdict's own p ± its Monte Carlo error, four decimals (0.0255 must not read as
    0.025, the level)."""
    return f"{c['p']:.4f} ± {c['mc_error']:.4f}"


def holm_text(c: dict) -> str:
    """Holm-adjusted p ± its Monte Carlo error; *borderline* within 3 errors of the level."""
    if "holm_p" not in c:
        return "-"
    text = f"{c['holm_p']:.4f} ± {c['holm_mc_error']:.4f}"
    return text if stable(c["holm_p"], c["holm_mc_error"]) else text + " (borderline)"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]  # fmt: skip


def untested(c: dict) -> str:
    """Why a claim has no verdict: ``not run yet: unsup/mean`` or ``no common seed``."""
    if "missing" in c:
        return f"{c['verdict']}: {', '.join(c['missing'])}"
    return c["verdict"]


def claims_table(claims: list[dict], family: bool) -> list[str]:
    rows = []
    for c in claims:
        if "difference" not in c:
            rows.append([c["claim"], "-", "-", untested(c), "-", "-", "-"])
            continue
        rows.append([c["claim"], f"{pts(c['a_mean'])} / {pts(c['b_mean'])}", interval(c),
                     verdict_text(c), p_text(c), holm_text(c) if family else "-",
                     seeds_text(c["seeds"])])  # fmt: skip
    return table(["claim (A beats B)", "A / B, over the seeds", "A - B x100 [95% interval]",
                  "verdict", "p ± MC error", "Holm p ± MC error", "seeds"], rows)  # fmt: skip


def checkpoint_name(c: dict) -> str:
    pooling = c["b"].split("/")[1]
    return f"untrained checkpoint, {pooling}" + (" (as published)" if c["published"] else "")


def context_table(context: list[dict]) -> list[str]:
    rows = [[c["a"], checkpoint_name(c), f"{pts(c['a_mean'])} / {pts(c['b_mean'])}", interval(c),
             verdict_text(c), p_text(c), seeds_text(c["seeds"])]
            for c in context]  # fmt: skip
    return table(["trained run (A)", "against (B)", "A / B, over the seeds",
                  "A - B x100 [95% interval]", "verdict", "p ± MC error", "seeds"], rows)  # fmt: skip


def family_line(summary: dict) -> str:
    """Which decided verdicts hold when L2's claims on the primary split are one family."""
    primary = summary["primary"]
    claims = [c for c in summary["splits"][primary]["claims"] if "holm_p" in c]
    if not claims:
        return "Family-wise: no claim judged yet."
    head = (
        f"Family-wise (Holm over the {len(claims)} claims judged on the "
        f"{SPLIT_NAMES[primary]}, each with its verdict's p, {summary['rules']['alpha']:.1%} "
        "one-sided): "
    )
    decided = [c for c in claims if c["verdict"] in DECIDED]
    if not decided:
        return head + "no verdict is better, worse or comparable, so none is there to correct."
    hold = [c for c in decided if c["family_wise"]]
    text = head + f"{len(hold)} of the {len(decided)} decided verdicts hold"
    name = lambda c: f"{c['claim']}, {c['verdict']} (Holm p {holm_text(c)})"  # noqa: E731
    text += ": " + "; ".join(name(c) for c in hold) if hold else ""
    fail = [c for c in decided if not c["family_wise"]]
    text += ". Not: " + "; ".join(name(c) for c in fail) if fail else ""
    return text + "."


# -- The summary paragraph ------------------------------------------------------------------


def _brief(c: dict, name: str, holm: bool = False) -> str:
    """``unsup: layer-attention beats mean (+1.23 points [+0.40, +2.05], Holm p 0.0012; 1
    seed: sentence pairs only)``; an inconclusive one with its detectable size instead."""
    if c["verdict"] == "inconclusive":
        inside = f"no difference larger than {100 * c['detectable']:.2f} points"
    else:
        inside = f"{interval(c)} points"
    if holm and "holm_p" in c:
        inside += f", Holm p {c['holm_p']:.4f}"
    few = few_seeds(c["seeds"])
    return f"{name} ({inside}{'; ' + few if few else ''})"


def _present_text(summary: dict) -> str:
    """``unsup/cls 0 of 5 seeds; sup/mean 3 of 5 seeds``: the runs not yet complete."""
    planned = len(summary["seeds_planned"])
    return "; ".join(
        f"{key} {planned - len(seeds)} of {planned} seeds"
        for key, seeds in summary["missing"].items()
    )


def _waiting(claims: list[dict]) -> str:
    return "; ".join(f"{c['claim']} ({untested(c)})" for c in claims)


def _claims_sentence(claims: list[dict], margin: float, split: str) -> list[str]:
    judged = [c for c in claims if "difference" in c]
    waiting = [c for c in claims if "difference" not in c]
    if not judged:
        return [
            f"None of claim L2's {len(claims)} comparisons can be judged yet: "
            + _waiting(waiting)
            + "."
        ]
    groups = []
    wise = [c for c in judged if c["verdict"] == "better" and c["family_wise"]]
    alone = [c for c in judged if c["verdict"] == "better" and not c["family_wise"]]
    if wise:
        groups.append(
            "holds family-wise for " + "; ".join(_brief(c, c["claim"], True) for c in wise)
        )
    if alone:
        groups.append(
            "holds by its own test, not family-wise, for "
            + "; ".join(_brief(c, c["claim"], True) for c in alone)
        )
    for verdict, words in (
        ("comparable", "does not hold but is comparable (layer-attention no worse than the "
                       f"baseline by more than {100 * margin:g} point; not shown better) for "),
        ("worse", "is contradicted (worse: layer-attention below the baseline) for "),
        ("inconclusive", "is inconclusive for "),
    ):  # fmt: skip
        found = [c for c in judged if c["verdict"] == verdict]
        if found:
            groups.append(words + "; ".join(_brief(c, c["claim"], True) for c in found))
    text = [
        f"Claim L2 on the {SPLIT_NAMES[split]} (the primary split; Holm over the "
        f"{len(judged)} claim{'s' if len(judged) != 1 else ''} judged there) "
        + "; it ".join(groups)
        + "."
    ]
    if waiting:
        text.append("Not judged yet: " + _waiting(waiting) + ".")
    return text


def _dev_sentence(test: list[dict], dev: list[dict]) -> list[str]:
    pairs = [(t, d) for t, d in zip(test, dev) if "difference" in t]
    if not pairs:
        return []
    differ = [(t, d) for t, d in pairs if t["verdict"] != d["verdict"]]
    if not differ:
        return ["STS-B dev (secondary, outside the family) gives the same verdicts."]
    return [
        "STS-B dev (secondary, outside the family) differs: "
        + "; ".join(
            f"{_brief(d, d['claim'])} is {d['verdict']} there ({t['verdict']} on test)"
            for t, d in differ
        )  # fmt: skip
        + "."
    ]


def _against_published(context: list[dict], margin: float) -> tuple[list[dict], str]:
    """The trained runs judged against the checkpoint's published pooling, and their verdicts
    grouped: ``comparable (...) for unsup/mean (-0.45 [-0.94, +0.02] points); ...``."""
    against = [c for c in context if c["published"] and "difference" in c]
    words = {"comparable": f"comparable (no worse by more than {100 * margin:g} point; not "
                           "shown better)"}  # fmt: skip
    groups = []
    for verdict in ("better", "comparable", "worse", "inconclusive"):
        found = [c for c in against if c["verdict"] == verdict]
        if found:
            named = "; ".join(_brief(c, c["a"]) for c in found)
            groups.append(f"{words.get(verdict, verdict)} for {named}")
    return against, "; ".join(groups)


def _checkpoint_sentence(summary: dict) -> list[str]:
    """Whether training beat the checkpoint's own (published) mean pooling: test, then dev."""
    margin = summary["rules"]["margin"]
    primary, secondary, published = summary["primary"], summary["secondary"], summary["published"]
    test, dev = summary["splits"][primary], summary["splits"][secondary]
    against, groups = _against_published(test["context"], margin)
    if not against:
        return ["No trained run yet to set against the untrained checkpoint's mean pooling."]
    beat = [c for c in against if c["verdict"] == "better"]
    conclusion = (
        f"training beat it in {len(beat)} of the {len(against)} trained settings"
        if beat
        else "no trained run is shown to beat it"
    )
    return [
        f"Against the untrained checkpoint's own mean pooling, the one it was published with "
        f"(context, not a claim; {SPLIT_NAMES[primary]} {pts(test['zero_shot'][published])}): "
        f"{groups}; so {conclusion} there.",
        f"On {SPLIT_NAMES[secondary]} ({pts(dev['zero_shot'][published])}): "
        f"{_against_published(dev['context'], margin)[1]}.",
    ]


def summary_paragraph(summary: dict) -> str:
    """What holds family-wise, what is comparable, what is inconclusive (with its detectable
    size), whether training beat the checkpoint's mean pooling; partial data said first."""
    present, planned = summary["runs_present"], summary["runs_planned"]
    if present < planned:
        sentences = [
            f"Partial data: {present} of {planned} planned runs are present (not yet complete: "
            f"{_present_text(summary)}); every verdict rests on the runs present."
        ]
    else:
        sentences = [f"All {planned} planned runs are present."]
    primary, secondary = summary["primary"], summary["secondary"]
    test, dev = summary["splits"][primary]["claims"], summary["splits"][secondary]["claims"]
    sentences += _claims_sentence(test, summary["rules"]["margin"], primary)
    sentences += _dev_sentence(test, dev)
    sentences += _checkpoint_sentence(summary)
    return " ".join(sentences)


# -- The README -----------------------------------------------------------------------------


def rules_note(summary: dict) -> str:
    r = summary["rules"]
    return (
        "Each claim as the paper words it (docs/claims.md, L2: layer-attention pooling "
        "*improves on* the baseline pooling), so a superiority claim per objective: "
        "layer-attention beats mean, layer-attention beats cls. Paired bootstrap over the "
        f"seeds both runs have and the sentence pairs ({r['resamples']:,} resamples; one draw "
        "of pairs shared by both runs), A - B the mean over drawn seeds of the Spearman "
        "difference. Verdicts (src/aclpipe/study/stats/verdicts.py, rules fixed in advance in "
        "sts/params.yaml, sts.verdicts): **better** when the share of resamples at or below 0, "
        "counted (k + 1) / (R + 1), is at most 2.5%; else **worse** when the share at or above "
        "0 is; else **comparable** (non-inferior) when the share at or below "
        f'-{100 * r["margin"]:g} point (the margin) is; else **inconclusive**, read with "no difference larger than '
        'x": the largest difference either way that the 95% interval leaves possible. p is the '
        "p of the printed verdict (inconclusive: of superiority), ± its Monte Carlo error at "
        "this R. A claim holds only when better. The STS Benchmark test is the primary split: "
        "its claims are one family, Holm's step-down over their printed p's, each adjusted p ± "
        "its Monte Carlo error, *borderline* when within 3 errors of 2.5%. STS-B dev is "
        'secondary: the same verdicts, outside the family. "1 seed: sentence pairs only": the '
        'interval resamples sentence pairs alone; "2 seeds only": it holds little of the '
        "seed-to-seed variation."
    )


def scores_table(study: StsStudy, summary: dict) -> list[str]:
    dev, test = summary["splits"]["dev"], summary["splits"]["test"]
    rows = []
    for objective in study.objectives:
        for pooling in study.poolings:
            key = f"{objective}/{pooling}"
            if key not in dev["runs"]:
                rows.append([objective, pooling, "0", "not run", "not run", ""])
                continue
            d, t = dev["runs"][key], test["runs"][key]
            sd = lambda r: "" if r["sd"] is None else f" ± {100 * r['sd']:.2f}"  # noqa: E731
            rows.append([objective, pooling, str(len(d["seeds"])), f"{pts(d['mean'])}{sd(d)}",
                         f"{pts(t['mean'])}{sd(t)}",
                         f"{pts(dev['zero_shot'][pooling])} / {pts(test['zero_shot'][pooling])}"])  # fmt: skip
    return table(["objective", "pooling", "seeds", "dev", "test",
                  "untrained checkpoint, same pooling (dev / test)"], rows)  # fmt: skip


def render_readme(study: StsStudy, summary: dict, meta: dict, figure: str) -> str:
    """The study's README (``aclpipe sts report``); ``figure``: the per-layer figure's file."""
    lines = [
        "# Layer-wise attention pooling on STS: contrastive sentence embeddings (claim L2)",
        "",
        "Generated by `aclpipe sts report` from `sts/runs/` (`dvc repro sts/dvc.yaml`); do not "
        "edit by hand. Objectives, data and pooling: docs/sentence_embeddings.md.",
        "",
        f"Model: `{summary['model']}`. Spearman x100 of the cosine similarity of the two "
        "sentences' embeddings against the gold scores, on the STS Benchmark test "
        f"({summary['splits']['test']['pairs']} pairs, `original/sts-test.tsv`; the primary "
        f"split) and STS-B dev ({summary['splits']['dev']['pairs']} pairs). No model "
        "selection: each run's final model is scored once on each.",
        "",
        f"Runs present: {summary['runs_present']} of {summary['runs_planned']} planned "
        f"({len(study.objectives)} objectives x {len(study.poolings)} poolings x "
        f"{len(study.seeds)} seeds).",
        "",
    ]
    for name, m in meta.items():
        lines.append(f"- `{name}` data: {json.dumps(m.get('built'))}; train rows used: "
                     f"{m['splits']['train']['examples']}")  # fmt: skip
    lines += [""] if meta else []
    lines += ["## Summary", "", summary_paragraph(summary), ""]
    lines += ["## Scores (mean ± sd over seeds)", "", *scores_table(study, summary), ""]
    lines += [
        "The untrained checkpoint's poolings are parameter-free (`cls`: the raw [CLS] vector; "
        "`layer-attention`: attention over layers with identity maps, study/sts/embeddings.py); the "
        "trained ones carry their learned maps.",
        "",
        "## Claim L2: layer-attention pooling against the baseline poolings",
        "",
        rules_note(summary),
        "",
    ]
    for split in (summary["primary"], summary["secondary"]):
        primary = split == summary["primary"]
        role = "primary: the family" if primary else "secondary: outside the family"
        lines += [f"### {SPLIT_NAMES[split]} ({role})", ""]
        lines += claims_table(summary["splits"][split]["claims"], family=primary)
        lines += ["", family_line(summary), ""] if primary else [""]
    lines += [
        "## Context, not claims: trained runs against the untrained checkpoint",
        "",
        "No paper claims these; they say what training did. Each trained run against the "
        "checkpoint's same pooling (parameter-free), and against the checkpoint's "
        f"{summary['published']} pooling: all-MiniLM-L6-v2 was itself trained contrastively on about a "
        "billion sentence pairs with mean pooling, so its zero-shot mean pooling, the "
        "checkpoint as published, is a strong baseline. The checkpoint is one fixed run, set "
        "against every seed. The same bootstrap and verdict words as the claims; no family.",
        "",
    ]
    for split in (summary["primary"], summary["secondary"]):
        context = summary["splits"][split]["context"]
        lines += [f"### {SPLIT_NAMES[split]}", ""]
        lines += context_table(context) if context else ["No trained run yet."]
        lines += [""]
    lines += [
        "## Spearman per layer (the layer-attention paper's Figure 1, on this model)",
        "",
        f"![Spearman per layer]({figure})",
        "",
        "Lines: the untrained checkpoint's parameter-free poolings at each layer; dashed: mean "
        "pooling at each layer of each trained run's encoder (mean over seeds); "
        "markers at the last layer: each trained objective and pooling with its own trained "
        "pooler (mean ± sd over seeds).",
        "",
    ]
    return "\n".join(lines)
