"""`.dvcignore` must not hide a published result from the stage that records it.

Two patterns left from an older layout once hid reports/campaign/results_score_vs_time.png
from the campaign report stage: DVC recorded 18 of its 19 files and could not tell when the
figure went stale. Every committed file under reports/ is a stage output, so none may be
ignored.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from paths import RELATIVE, at

from aclpipe.layout import RESULTS_COST_PNG
from aclpipe.study.campaign.markdown import campaign_reports

ROOT = Path(__file__).resolve().parents[1]


def _dvc() -> list[str]:
    exe = Path(sys.executable).with_name("dvc")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("dvc")
    if found is None:
        pytest.skip("dvc is not installed")
    return [found]


def _ignored(paths: list[str]) -> list[str]:
    """The paths `.dvcignore` hides (``dvc check-ignore``: exit 0 and their names, or 1)."""
    done = subprocess.run([*_dvc(), "check-ignore", *paths], cwd=ROOT, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return done.stdout.split()


@pytest.mark.slow
def test_no_published_report_file_is_ignored_by_dvc() -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in at(ROOT).reports().rglob("*") if p.is_file())
    assert (campaign_reports(RELATIVE.reports()) / RESULTS_COST_PNG).as_posix() in files
    assert _ignored(files) == []


@pytest.mark.slow
def test_check_ignore_sees_a_pattern_that_would_hide_it(tmp_path: Path) -> None:
    """The probe itself works: the old pattern, in a scratch repository, hides the figure."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[core]\n    analytics = false\n    no_scm = true\n")
    (tmp_path / ".dvcignore").write_text("reports/*/results_*.png\n")
    figure = campaign_reports(at(tmp_path).reports()) / RESULTS_COST_PNG
    figure.parent.mkdir(parents=True)
    figure.write_bytes(b"png")
    done = subprocess.run([*_dvc(), "check-ignore", str(figure.relative_to(tmp_path))],
                          cwd=tmp_path, capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0 and RESULTS_COST_PNG in done.stdout
