"""The README quotes the recorded reports: every interval and Holm p it gives in a study's
section is one the study's generated report prints now, so a rebuilt report cannot leave the
README's figures behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from paths import REPO, at

from aclpipe.layout import CAMPAIGN, FEWSHOT_REPORTS, REPORTS_README

REPORTS = at(REPO).reports()
README = REPO / "README.md"
# README section heading -> the generated reports it quotes (a folder: every .md below it)
SECTIONS = {
    "## Results on real GLUE: the seeds campaign": [
        REPORTS / REPORTS_README,
        at(REPO).reports(CAMPAIGN),
    ],
    "## Few-shot: SCL's own regime (fewshot/)": [REPORTS / FEWSHOT_REPORTS / REPORTS_README],
    "## Sentence embeddings on STS: layer-attention pooling (sts/)": [
        at(REPO).sts_study_reports() / REPORTS_README
    ],
}
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


@pytest.mark.parametrize("heading", list(SECTIONS))
def test_readme_intervals_and_holm_ps_are_the_reports(heading):
    readme = README.read_text(encoding="utf-8")
    text = flat(section(readme, heading))
    report = report_text(SECTIONS[heading])
    intervals = INTERVAL.findall(text)
    assert intervals, f"{heading}: the README quotes no interval here"
    stale = [f"{d} [{lo}, {hi}]" for d, lo, hi in intervals if f"{d} [{lo}, {hi}]" not in report]
    adjusted = re.findall(r"(\d\.\d+) ±", report)
    stale += [f"Holm {p}" for p in HOLM.findall(text) if not quotes(p, adjusted)]
    assert not stale, f"README's {heading!r} quotes figures its report no longer prints: {stale}"


def test_readme_counts_the_few_shot_runs_the_report_counts():
    readme = flat(README.read_text(encoding="utf-8"))
    report = flat((REPORTS / FEWSHOT_REPORTS / REPORTS_README).read_text(encoding="utf-8"))
    done = re.search(r"Runs done: (\d+) of (\d+)", report)
    quoted = re.search(r"(\d+) of (\d+) runs are in", readme)
    assert done and quoted and quoted.groups() == done.groups()
