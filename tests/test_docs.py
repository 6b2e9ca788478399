"""The docs a user reads: the README is a short front door whose quick start runs, the docs
site builds strictly, its reference pages cover every command and every params key, no page
tells history, and the repository carries its own meaning (nothing points outside it for a
definition)."""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from paths import REPO

from aclpipe.cli import app

README = REPO / "README.md"
DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS))

import gen_reference  # noqa: E402  (docs/gen_reference.py: the generated reference pages)

PAGES = [README, REPO / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)


def page_commands(page: Path) -> list[list[str]]:
    """Every `aclpipe ...` a page's code blocks run (prompt, comments and pipes dropped)."""
    commands = []
    for block in code_blocks(page.read_text(encoding="utf-8")):
        lines = block.splitlines()
        if any(line.startswith("$ ") for line in lines):  # a session: the rest is output
            lines = [line for line in lines if line.startswith("$ ")]
        for line in lines:
            line = line.split(" #")[0].strip().removeprefix("$ ")
            start = line.find("aclpipe ")
            if start < 0:
                continue
            words = shlex.split(line[start:].split("|")[0].rstrip("\\ "))
            if words[:1] == ["aclpipe"]:
                commands.append(words)
    return commands


def readme_commands() -> list[list[str]]:
    return page_commands(README)


def resolve(words: list[str]):
    """The click command ``aclpipe <words>`` names, and the words after its name."""
    command = typer.main.get_command(app)
    rest = words[1:]
    while hasattr(command, "commands") and rest and rest[0] in command.commands:
        command, rest = command.commands[rest[0]], rest[1:]
    return command, rest


def test_readme_is_a_front_door():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"
    first = code_blocks(text)[0].splitlines()
    assert [line.split()[:2] for line in first[:2]] == [["make", "repro"], ["make", "test"]]
    for target in ("repro:", "test:"):  # the two commands are still true
        assert re.search(rf"^{target}", (REPO / "Makefile").read_text(), flags=re.M)


def test_readme_quick_start_names_the_three_commands():
    commands = [" ".join(words) for words in readme_commands()]
    text = README.read_text(encoding="utf-8")
    assert "$ dvc repro" in text
    assert any(c.startswith("aclpipe finetune") and "--method acl-cl" in c for c in commands)
    assert "aclpipe tradeoff --task qnli" in commands


@pytest.mark.parametrize(
    "words",
    [words for page in PAGES for words in page_commands(page)],
    ids=lambda words: " ".join(words),
)
def test_the_commands_readme_and_docs_run_exist_with_their_options(words):
    command, rest = resolve(words)
    assert not hasattr(command, "commands"), f"{' '.join(words)}: no such command"
    options = {name for p in command.params for name in [*p.opts, *p.secondary_opts]}
    given = {w.split("=")[0] for w in rest if w.startswith("-") and w != "-"}
    assert given <= options, f"{' '.join(words)}: unknown options {sorted(given - options)}"


# A date, a commit id, or history told in prose ("Until <date>, ...").
HISTORY = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bcommit [0-9a-f]{7,40}\b|\bUntil \w")


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "CHANGELOG.md"], ids=str)
def test_no_dates_commit_ids_or_history(page):
    found = HISTORY.findall(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(REPO)} tells history: {found} (CHANGELOG.md holds it)"


def test_the_cli_reference_covers_every_command_and_option():
    page = gen_reference.cli_markdown()
    for path, command in gen_reference._walk(typer.main.get_command(app), ["aclpipe"]):
        section = page.split(f"## `{' '.join(path)}`", 1)
        assert len(section) == 2, path
        body = section[1].split("\n## ", 1)[0]
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            shown = param.name.upper() if param.param_type_name == "argument" else param.opts[0]
            assert f"`{shown}`" in body, (path, shown)


def test_the_params_reference_covers_every_key_with_its_default_and_range():
    from aclpipe.checks import range_check
    from aclpipe.config import Params
    from aclpipe.training.knobs import KNOBS

    page = gen_reference.params_markdown()
    sections = {f.name: f.default_factory for f in dataclasses.fields(Params)}
    classes = {name: factory().__class__ for name, factory in sections.items() if name != "methods"}
    classes |= {f"methods.{name}": cls for name, cls in KNOBS.items()}
    for title, cls in classes.items():
        body = page.split(f"## `{title}`", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
        rows = {
            line.split("|")[1].strip(): line for line in body.splitlines() if line.startswith("| `")
        }
        for field in dataclasses.fields(cls):
            row = rows[f"`{field.name}`"]
            cells = [c.strip() for c in row.strip("|").split(" | ")]
            assert cells[2], (title, field.name, "no default")
            if range_check(cls, field.name) is not None:
                assert cells[3], (title, field.name, "a checked key shows no range")


def test_range_text_is_read_from_the_checks():
    from aclpipe.checks import non_negative, one_of, positive, unit
    from aclpipe.data.config import DataConfig

    assert gen_reference._check_text(positive) == "> 0"
    assert gen_reference._check_text(non_negative) == ">= 0"
    assert gen_reference._check_text(unit) == "[0, 1]"
    assert gen_reference._check_text(one_of("a", "b")) == "one of `a`, `b`"
    assert gen_reference._check_text(DataConfig.RANGES["validation_fraction"]) == "[0, 1)"


@pytest.mark.slow
def test_the_docs_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", **_env()},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for page in ("reference/cli", "reference/params", "methods", "claims"):
        assert (site / page / "index.html").is_file(), page


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO / "src")}


# -- nothing points outside the repository for meaning -------------------------------------

# The parent folder may only be named as the default GLUE location (SHARED + "glue"); the
# project's own docs/methods.md and docs/claims.md replace the spec files kept outside it.
# (Built from parts, so that this file does not name what it looks for.)
SHARED = "../" + "shared/"
SPECS = [f"{name}.md" for name in ("METHODS", "CLAIMS", "STYLE")]
OUTSIDE = re.compile(
    re.escape(SHARED) + r"(?!glue\b)|(?<![\w/.-])(?:" + "|".join(map(re.escape, SPECS)) + ")"
)
def candidate_lines() -> list[tuple[str, str]]:
    """(file, line) of every tracked text file's line that names the parent folder or an outside
    spec file, found by git grep (fast), to be judged by OUTSIDE."""
    words = [SHARED, *SPECS]
    done = subprocess.run(
        ["git", "grep", "-I", "-n", "-F", *[arg for w in words for arg in ("-e", w)]],
        cwd=REPO, capture_output=True, text=True, errors="ignore",
    )  # fmt: skip
    if done.returncode not in (0, 1):  # 1: nothing found
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    found = []
    for line in done.stdout.splitlines():
        name, _, text = line.split(":", 2)
        found.append((name, text))
    return found


def test_nothing_points_outside_the_repository_for_meaning():
    found = [
        f"{name}: {match.group(0)}"
        for name, text in candidate_lines()
        if not name.startswith("data/")
        for match in OUTSIDE.finditer(text)
    ]
    assert not found, found


def test_the_pattern_tells_the_glue_default_from_meaning():
    methods, claims = SPECS[0], SPECS[1]
    assert not OUTSIDE.search(f"glue_dir: {SHARED}glue  # classic layout")
    assert not OUTSIDE.search("see docs/methods.md and docs/claims.md")
    for text in (f"Definitions: {SHARED}{methods}", f"({methods}, Pooling)", f"{claims} A1",
                 f"{SHARED}{claims}", f"{SHARED}glue2/x"):  # fmt: skip
        assert OUTSIDE.search(text), text


def test_the_version_is_written_once_and_read_from_the_metadata():
    import tomllib
    from importlib.metadata import version

    from typer.testing import CliRunner

    import aclpipe

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert aclpipe.__version__ == version("aclpipe") == declared
    done = CliRunner().invoke(app, ["--version"])
    assert done.exit_code == 0 and done.output.strip() == f"aclpipe {declared}"
