"""``aclpipe campaign record``: a campaign's finished stages recorded in one pass, with the lock
``dvc commit -f`` writes (aclpipe.study.campaign.record), on a small DVC repository written here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from aclpipe.cli import app
from aclpipe.errors import UserError
from aclpipe.study.campaign.plan import load_campaign
from aclpipe.study.campaign.record import record, recorded

# stages named as the campaigns' are: prepare@<task>, run@<seed>-<task>, and a report
DVC_YAML = """\
stages:
  prepare:
    foreach: [sst2]
    do:
      cmd: echo prepare
      deps:
        - src.txt
      outs:
        - data/${item}
  run:
    matrix:
      seed: [1, 2]
      task: [sst2]
    cmd: echo run
    deps:
      - src.txt
      - data/${item.task}
    outs:
      - runs/${item.task}/ce-s${item.seed}:
          cache: false
  report:
    cmd: echo report
    deps: [runs]
    outs:
      - report.md:
          cache: false
"""


def dvc(repo: Path, *args: str) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    out = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True,
                         text=True, check=True, env=env)  # fmt: skip
    return out.stdout


def changed(repo: Path) -> set[str]:
    """The stages ``dvc status`` calls changed."""
    return {name.split(":")[-1] for name in json.loads(dvc(repo, "status", "--json", "study/dvc.yaml") or "{}")}


@pytest.fixture
def study(tmp_path: Path, params_dict) -> Path:
    """A DVC repository with a study folder: its params, its dvc.yaml, the prepared data, one
    finished run of two and a report."""
    repo = tmp_path / "repo"
    folder = repo / "study"
    folder.mkdir(parents=True)
    raw = {**params_dict(None), "campaign": {"tasks": ["sst2"], "seeds": [1, 2], "runs": ["ce"]}}
    (folder / "params.yaml").write_text(yaml.safe_dump(raw))
    (folder / "dvc.yaml").write_text(DVC_YAML)
    (folder / "src.txt").write_text("code\n")
    (folder / "data/sst2").mkdir(parents=True)
    (folder / "data/sst2/train.jsonl").write_text("{}\n")
    (folder / "runs/sst2/ce-s1").mkdir(parents=True)
    (folder / "runs/sst2/ce-s1/run.json").write_text("{}\n")
    (folder / "report.md").write_text("# report\n")
    dvc(repo, "init", "--no-scm", "-q")
    dvc(repo, "config", "core.analytics", "false")
    return repo


def test_record_writes_what_dvc_commit_writes_in_one_pass(study: Path, monkeypatch) -> None:
    twin = study.parent / "twin"
    shutil.copytree(study, twin)
    dvc(twin, "commit", "-f", "study/dvc.yaml:prepare@sst2", "study/dvc.yaml:run@1-sst2")
    monkeypatch.chdir(study)
    campaign = load_campaign(Path("study/params.yaml"))
    names, waiting = record(campaign)
    assert (sorted(names), waiting) == (["prepare@sst2", "run@1-sst2"], 1)  # run 2 has no folder
    lock = (study / "study/dvc.lock").read_text()
    assert lock == (twin / "study/dvc.lock").read_text()  # byte for byte
    assert "report" not in recorded(study / "study/dvc.lock")  # rebuilt, never recorded
    assert changed(study) == {"run@2-sst2", "report"}
    assert record(campaign) == ([], 1)  # nothing new
    # a change to a dep: the recorded stages are changed; --all records them again
    (study / "study/src.txt").write_text("code, reformatted\n")
    assert {"prepare@sst2", "run@1-sst2"} <= changed(study)
    assert record(campaign) == ([], 1)
    names, _ = record(campaign, everything=True)
    assert sorted(names) == ["prepare@sst2", "run@1-sst2"]
    assert changed(study) == {"run@2-sst2", "report"}


def test_record_command_and_its_one_line_errors(study: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(study)
    args = ["campaign", "record", "--campaign", "study/params.yaml"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and "recorded 2 stages in study/dvc.lock" in result.output
    assert "1 wait for their runs" in result.output
    result = CliRunner().invoke(app, [*args, "--all"])
    assert result.exit_code == 0 and "re-recorded 2 stages" in result.output, result.output
    (study / "study/dvc.yaml").unlink()
    with pytest.raises(UserError, match="has no dvc.yaml beside it"):
        record(load_campaign(Path("study/params.yaml")))
    outside = tmp_path / "outside"
    shutil.copytree(study / "study", outside / "study")
    (outside / "study/dvc.yaml").write_text(DVC_YAML)
    monkeypatch.chdir(outside)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "not inside a DVC repository" in result.output
    assert len(result.output.strip().splitlines()) == 1


FEWSHOT_DVC_YAML = """\
stages:
  prepare-peers:
    matrix:
      seed: [3]
      task: [sst2]
    cmd: echo prepare
    deps: [src.txt]
    outs:
      - data/${item.task}/s${item.seed}
  run:
    matrix:
      seed: [1]
      task: [sst2]
      n: [4]
      run: [ce]
    cmd: echo run
    deps: [src.txt]
    outs:
      - runs/${item.task}/${item.run}-n${item.n}-s${item.seed}:
          cache: false
  peers:
    matrix:
      seed: [3]
      task: [sst2]
      n: [4]
      run: [linear-probe]
    cmd: echo peer
    deps: [src.txt, data/sst2/s3]
    outs:
      - runs/${item.task}/${item.run}-n${item.n}-s${item.seed}:
          cache: false
"""


def test_record_takes_a_few_shot_studys_cells_and_their_prepare_stages(study: Path, params_dict, monkeypatch) -> None:
    folder = study / "study"
    cells = {"peers": {"runs": ["linear-probe"], "tasks": ["sst2"], "fewshot": [4], "seeds": [3]}}
    spec = {"tasks": ["sst2"], "seeds": [1], "runs": ["ce"], "fewshot": [4], "cells": cells}
    (folder / "params.yaml").write_text(yaml.safe_dump({**params_dict(None), "campaign": spec}))
    (folder / "dvc.yaml").write_text(FEWSHOT_DVC_YAML)
    (folder / "data/sst2/s3").mkdir(parents=True)
    (folder / "data/sst2/s3/train.jsonl").write_text("{}\n")
    (folder / "runs/sst2/linear-probe-n4-s3").mkdir(parents=True)
    (folder / "runs/sst2/linear-probe-n4-s3/run.json").write_text("{}\n")
    monkeypatch.chdir(study)
    campaign = load_campaign(Path("study/params.yaml"))
    assert campaign.stage("sst2", "linear-probe-n4", 3) == "peers@3-sst2-4-linear-probe"
    names, waiting = record(campaign)
    assert (sorted(names), waiting) == (["peers@3-sst2-4-linear-probe", "prepare-peers@3-sst2"], 1)
    assert changed(study) == {"run@1-sst2-4-ce"}  # the one without its folder
