"""The README and the docs quote the recorded reports: every interval and Holm p they give is
one a study's generated report prints now, so a rebuilt report cannot leave their figures
behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from paths import REPO, at

from aclpipe.layout import CAMPAIGN, FEWSHOT_REPORTS, REPORTS_README

REPORTS = at(REPO).reports()
# every generated study report (a folder: every .md below it)
STUDY_REPORTS = [
    REPORTS / REPORTS_README,
    at(REPO).reports(CAMPAIGN),
    REPORTS / FEWSHOT_REPORTS / REPORTS_README,
    at(REPO).sts_study_reports() / REPORTS_README,
    REPO / "fewshot" / "gap" / "summary.md",  # the SetFit-gap ablations (fewshot/gap/summarize.py)
]
QUOTING = ["README.md", "docs/studies.md"]  # the pages that quote study results
INTERVAL = re.compile(r"([+-]?\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]")
HOLM = re.compile(r"Holm (?:p )?(\d\.\d+)")


def flat(text: str) -> str:
    """One line, table cells joined by single spaces: ``| +1.8 | [+0.6, +3.1] |`` reads
    ``+1.8 [+0.6, +3.1]`` as the prose writes it."""
    return " ".join(re.sub(r"\s*\|\s*", " ", text).split())


def section(readme: str, heading: str) -> str:
    start = readme.index(heading)
    end = readme.find("\n## ", start + len(heading))
    return readme[start : end if end >= 0 else None]


def quotes(shown: str, printed: list[str]) -> bool:
    """Whether ``shown`` is one of ``printed`` at the README's (coarser or equal) precision."""
    places = len(shown.split(".")[1])
    return any(
        round(float(p), places) == float(shown) and len(p.split(".")[1]) >= places for p in printed
    )


def report_text(paths: list[Path]) -> str:
    texts = []
    for path in paths:
        files = sorted(path.rglob("*.md")) if path.is_dir() else [path]
        texts += [f.read_text(encoding="utf-8") for f in files]
    return flat("\n".join(texts))


def test_the_reader_finds_figures_in_both_forms():
    # the prose form and the table form of one figure read alike; a figure not printed is absent
    table = flat("| 20 | S1 | +1.8 | [+0.6, +3.1] | 0.002 | 0.015 ± 0.007 |")
    assert "+1.8 [+0.6, +3.1]" in table and "0.015 ±" in table
    assert "+1.8 [+0.6, +3.2]" not in table
    prose = (
        "scl - ce is +1.8 [+0.6,\n+3.1] (better, Holm 0.015), ratio 0.86 [0.61, 1.17], Holm p 0.049"
    )
    text = flat(prose)
    assert INTERVAL.findall(text) == [("+1.8", "+0.6", "+3.1"), ("0.86", "0.61", "1.17")]
    assert HOLM.findall(text) == ["0.015", "0.049"]
    assert quotes("0.052", ["0.0516"]) and quotes("0.015", ["0.015"])
    assert not quotes("0.008", ["0.015", "0.0086"]) and not quotes("0.0516", ["0.052"])
    assert section("# a\n## One\nx 1\n## Two\ny\n", "## One") == "## One\nx 1"


@pytest.mark.parametrize("page", QUOTING)
def test_quoted_intervals_and_holm_ps_are_the_reports(page):
    text = flat((REPO / page).read_text(encoding="utf-8"))
    report = report_text(STUDY_REPORTS)
    intervals = INTERVAL.findall(text)
    assert intervals, f"{page} quotes no interval"
    stale = [f"{d} [{lo}, {hi}]" for d, lo, hi in intervals if f"{d} [{lo}, {hi}]" not in report]
    adjusted = re.findall(r"(\d\.\d+) ±", report)
    stale += [f"Holm {p}" for p in HOLM.findall(text) if not quotes(p, adjusted)]
    assert not stale, f"{page} quotes figures its reports no longer print: {stale}"
