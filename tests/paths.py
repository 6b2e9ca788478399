"""Where the stages put things, for the tests: asked of ``aclpipe.layout``, never spelled here.

A test that checks a stage's output names the file as layout does (``layout.METRICS``) and
its folder through a ``Layout`` rooted in the test's work dir, so a renamed file or folder is
renamed in one place and the tests follow.
"""

from __future__ import annotations

from pathlib import Path

from aclpipe.layout import CAMPAIGN, Layout

REPO = Path(__file__).resolve().parents[1]  # the repository root: the default pipeline's root
RELATIVE = Layout(Path())  # paths relative to a project's root, as the CLI and DVC spell them


def at(root: Path) -> Layout:
    """The default pipeline's layout under ``root`` (a test's work dir, or ``REPO``)."""
    return Layout(Path(root))


def campaign_at(root: Path) -> Layout:
    """The seeds campaign's layout in a checkout at ``root`` (its data, runs and scratch
    models live under ``campaign/``; its reports under ``root``'s reports/campaign/)."""
    return Layout(Path(root) / CAMPAIGN)


def rel(path: Path, root: Path) -> str:
    """``path`` as the CLI and DVC spell it: relative to ``root``, with forward slashes."""
    return Path(path).relative_to(root).as_posix()
