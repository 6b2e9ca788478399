"""The stack check: one run on two library stacks, compared file by file (sha256 against a
plain hashlib reference), its one-line errors, the CLI that records it, and the sentence the
campaign overview prints under its stacks."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import invoke, ok
from paths import at, campaign_at
from test_campaign_report import STACK, built  # noqa: F401  (the fixture)

from aclpipe.errors import UserError
from aclpipe.layout import (
    CAMPAIGN_PARAMS,
    CURVES_CSV,
    META,
    METRICS,
    PREDICTIONS,
    REPORTS_README,
    RUN_RECORD,
    STACK_CHECK_SCRIPT,
    TRAINING_LOG,
)
from aclpipe.study.campaign.plan import load_campaign
from aclpipe.study.campaign.report import write_reports
from aclpipe.study.campaign.stack_check import (
    STACK_CHECK,
    compare_runs,
    load_check,
    stack,
    stack_sentence,
)

OTHER = {**STACK, "transformers": "4.1"}
FILES = {
    METRICS: b'{"dev": 0.5}',
    PREDICTIONS: bytes(range(256)) * 4,
    f"{TRAINING_LOG}/plots/metrics/train/loss.tsv": b"step\tloss\n1\t0.69\n",
}


def run_folder(root: Path, environment: dict, files: dict[str, bytes] = FILES, **record) -> Path:
    """A finished run's folder: run.json (with ``environment``) and ``files``."""
    folder = root / f"run-{len(list(root.glob('run-*')))}"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    run = {
        "task": "mrpc", "run": "acl-cl", "method": "acl-cl", "seed": 1,
        "params": {"train": {"epochs": 1}},
        "data": {"splits": {"train": {"examples": 3302}}},
        **record, "environment": environment,
    }  # fmt: skip
    (folder / RUN_RECORD).write_text(json.dumps(run))
    return folder


def test_the_same_bytes_on_two_stacks(tmp_path: Path) -> None:
    check = compare_runs(run_folder(tmp_path, STACK), run_folder(tmp_path, OTHER))
    assert check["differing"] == [] and check["files"] == 3  # run.json is not compared
    assert check["changed"] == {"transformers": ["4.0", "4.1"]}
    assert check["stacks"] == [stack({"environment": STACK}), stack({"environment": OTHER})]
    assert check["run"] == {"task": "mrpc", "run": "acl-cl", "method": "acl-cl", "seed": 1}
    assert (check["epochs"], check["train_examples"]) == (1, 3302)
    for name, data in FILES.items():
        digest = hashlib.sha256(data).hexdigest()
        assert check["sha256"][name] == [digest, digest]


def test_a_changed_or_missing_file_is_named(tmp_path: Path) -> None:
    changed = {**FILES, PREDICTIONS: bytes(range(256)) * 3 + bytes(256)}
    del changed[METRICS]
    check = compare_runs(run_folder(tmp_path, STACK), run_folder(tmp_path, OTHER, changed))
    assert check["differing"] == [METRICS, PREDICTIONS]
    assert check["sha256"][METRICS][1] is None
    assert check["files"] == 3
    extra = {**FILES, CURVES_CSV: b"policy\n"}  # a file only the second run has
    check = compare_runs(run_folder(tmp_path, STACK), run_folder(tmp_path, OTHER, extra))
    assert check["differing"] == [CURVES_CSV] and check["files"] == 4


def test_not_the_same_run_or_not_two_stacks_is_a_one_line_error(tmp_path: Path) -> None:
    a = run_folder(tmp_path, STACK)
    with pytest.raises(UserError, match=r"not the same run \(their run.json differ in seed\)"):
        compare_runs(a, run_folder(tmp_path, OTHER, seed=2))
    longer = {"train": {"epochs": 2}}
    with pytest.raises(UserError, match=r"differ in params\)"):
        compare_runs(a, run_folder(tmp_path, OTHER, params=longer))
    with pytest.raises(UserError, match="holds only run.json"):
        compare_runs(a, run_folder(tmp_path, OTHER, {}))
    cpu = compare_runs(a, run_folder(tmp_path, {**STACK, "cpu": "x"}))  # a key stack() omits
    assert cpu["changed"] == {"cpu": [None, "x"]}
    with pytest.raises(UserError, match="ran on the same stack"):
        compare_runs(a, run_folder(tmp_path, STACK))
    with pytest.raises(UserError, match="has no run.json"):
        compare_runs(a, tmp_path)
    (a / RUN_RECORD).write_text("{")
    with pytest.raises(UserError, match="is not JSON"):
        compare_runs(a, a)


def test_the_sentence_under_the_stacks(tmp_path: Path) -> None:
    same = compare_runs(run_folder(tmp_path, STACK), run_folder(tmp_path, OTHER))
    one, two = same["stacks"]
    assert stack_sentence(same, {one}) is None  # one stack: nothing to say
    assert stack_sentence(None, {one, two}).startswith("These runs span 2 stacks that no ")
    third = stack({"environment": {**STACK, "torch": "2.1"}})
    assert "no recorded check has compared" in stack_sentence(same, {one, third})
    text = stack_sentence(same, {one, two})
    assert text.startswith("Checked across the two stacks (transformers 4.0 against 4.1): the same")
    assert "(mrpc acl-cl seed 1, 1 epoch on 3302 examples), trained on each" in text
    assert "run.json does not record the CPU, the thread count or the other packages" in text
    assert "byte-identical files, 3 of 3" in text
    changed = {**FILES, METRICS: b"{}"}
    differ = compare_runs(run_folder(tmp_path, STACK), run_folder(tmp_path, OTHER, changed))
    text = stack_sentence(differ, {one, two})
    assert "differed in 1 of 3 files (metrics.json): a task's claims over runs on" in text


@pytest.mark.slow
def test_the_command_writes_the_check_and_the_overview_cites_it(
    built: Path,  # noqa: F811  (the fixture)
    tmp_path: Path,
) -> None:
    a, b = run_folder(tmp_path, STACK), run_folder(tmp_path, {**STACK, "device": "gpu"})
    out = built.parent / STACK_CHECK
    result = invoke("campaign", "stack-compare", str(a), str(a), "--campaign", str(built))
    assert result.exit_code == 2 and "ran on the same stack" in result.output
    assert "Traceback" not in result.output and not out.exists()  # nothing half-written
    reports = at(tmp_path).reports()
    write_reports(load_campaign(built), reports)  # its runs span cpu and gpu, unchecked
    assert "that no recorded check has compared" in (reports / REPORTS_README).read_text()
    printed = ok("campaign", "stack-compare", str(a), str(b), "--campaign", str(built))
    assert "3 of 3 files identical" in printed
    assert json.loads(out.read_text()) == compare_runs(a, b)
    write_reports(load_campaign(built), reports)
    overview = (reports / REPORTS_README).read_text()
    assert "Checked across the two stacks (device cpu against gpu): the same run" in overview
    assert overview.index("Checked across") < overview.index("## The papers' claims")


REPO = Path(__file__).resolve().parents[1]
FAKE_PY = """#!/usr/bin/env bash
# pip: "installs" the other version (an empty package); anything else: the real Python
if [ "$1" = -m ] && [ "$2" = pip ]; then
  echo "${{@: -1}}" >> "$CALLS.pip"
  while [ $# -gt 0 ]; do [ "$1" = --target ] && mkdir -p "$2/transformers"; shift; done
  exit 0
fi
exec {python} "$@"
"""
FAKE_ACLPIPE = """#!{python}
# campaign run: a run folder whose stack is the other one when the installed folder leads
# PYTHONPATH; stack-compare: the real command
import json, os, sys
from pathlib import Path
import yaml
from aclpipe.layout import METRICS, RUN_RECORD, Layout
args = sys.argv[1:]
with open(os.environ["CALLS"], "a") as f:
    f.write(json.dumps([args, os.environ.get("PYTHONPATH", ""), os.environ["OMP_NUM_THREADS"]]) + "\\n")
if args[:2] == ["campaign", "run"]:
    opt = dict(zip(args[2::2], args[3::2]))
    params = yaml.safe_load(open(opt["--campaign"]))
    root = Path(opt["--campaign"]).parent
    other = (Path(os.environ.get("PYTHONPATH", "x").split(":")[0]) / "transformers").is_dir()
    env = {{"device": "cpu", "torch": "2.13.0", "cuda": "none", "python": "3.11",
            "transformers": "5.24.0" if other else "5.25.0"}}
    fake = os.environ["FAKE"] if other else ""
    if fake == "fail":
        sys.exit("training failed")  # the other stack's run breaks off
    folder = Layout(root).run(opt["--task"], opt["--run"], int(opt["--seed"]))
    folder.mkdir(parents=True)
    (folder / METRICS).write_text('{{"dev": 0.5}}' if fake == "differ" else "{{}}")
    (folder / RUN_RECORD).write_text(json.dumps({{
        "task": opt["--task"], "run": opt["--run"], "method": opt["--run"],
        "seed": int(opt["--seed"]), "params": {{"train": {{
            "epochs": params["campaign"]["task_settings"][opt["--task"]]["train"]["epochs"]}}}},
        "data": {{"splits": {{"train": {{"examples": 10}}}}}}, "environment": env}}))
else:
    from aclpipe.cli import app
    sys.argv = ["aclpipe", *args]
    app()
"""


INHERITED = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _script(root: Path, *args: str, fake: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "ROOT": str(root), "PY": str(root / "py"), "FAKE": fake,
           "ACLPIPE": str(root / "aclpipe"), "CALLS": str(root / "calls.jsonl"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *INHERITED])}  # fmt: skip
    return subprocess.run(["bash", str(REPO / STACK_CHECK_SCRIPT), *args],
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


def _checkout(tmp_path: Path) -> Path:
    """A checkout holding the campaign's params and the stand-ins for Python and aclpipe."""
    root = tmp_path / "checkout"
    campaign_at(root).root.mkdir(parents=True)
    shutil.copy(REPO / CAMPAIGN_PARAMS, root / CAMPAIGN_PARAMS)
    for name, text in (("py", FAKE_PY), ("aclpipe", FAKE_ACLPIPE)):
        (root / name).write_text(text.format(python=sys.executable))
        (root / name).chmod(0o755)
    return root


def _scratch(root: Path) -> Path:
    """The script's temporary folder, read from the first run's --campaign argument."""
    args = json.loads((root / "calls.jsonl").read_text().splitlines()[0])[0]
    return Path(args[args.index("--campaign") + 1]).parents[2]


@pytest.mark.slow
def test_the_script_trains_the_run_on_both_stacks_and_compares(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    usage = _script(root, "5.24.0", "mrpc")
    assert usage.returncode == 2 and usage.stderr.startswith("usage: campaign/stack_check.sh")
    missing = _script(root, "5.24.0")
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        "error: campaign/data/mrpc is not prepared: run `aclpipe campaign prepare --task mrpc` "
        "first"
    ]
    campaign_at(root).data("rte").mkdir(parents=True)
    (campaign_at(root).data("rte") / META).write_text("{}")
    done = _script(root, "5.24.0", "rte", "scl", "3", "2")
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in (root / "calls.jsonl").read_text().splitlines()]
    assert [c[0][:2] for c in calls] == [["campaign", "run"]] * 2 + [["campaign", "stack-compare"]]
    inherited = os.pathsep.join([str(REPO / "src"), *INHERITED])  # never empty here
    assert (root / "calls.jsonl.pip").read_text() == "transformers==5.24.0\n"
    assert calls[0][1] == inherited and calls[0][2] == "1"  # this stack: PYTHONPATH as it was
    lib, *rest = calls[1][1].split(":")
    assert lib.endswith("/lib") and ":".join(rest) == inherited  # the other version first
    check = json.loads((campaign_at(root).root / STACK_CHECK).read_text())
    assert check["changed"] == {"transformers": ["5.24.0", "5.25.0"]}  # the other one first
    assert (check["epochs"], check["run"]["seed"], check["differing"]) == (2, 3, [])
    assert not _scratch(root).exists()  # the scratch runs and the installed version are gone


@pytest.mark.slow
def test_the_script_cleans_up_a_failed_run_and_keeps_two_runs_that_differ(
    tmp_path: Path,
) -> None:
    root = _checkout(tmp_path)
    campaign_at(root).data("mrpc").mkdir(parents=True)
    (campaign_at(root).data("mrpc") / META).write_text("{}")
    failed = _script(root, "5.24.0", fake="fail")
    assert failed.returncode != 0 and failed.stderr.strip().splitlines() == ["training failed"]
    assert not _scratch(root).exists()  # the trap removed the scratch on the failure path too
    assert not (campaign_at(root).root / STACK_CHECK).exists()  # nothing recorded
    (root / "calls.jsonl").unlink()
    differ = _script(root, "5.24.0", fake="differ")
    work = _scratch(root)
    assert differ.returncode == 1
    assert differ.stderr.strip().splitlines()[-1] == (
        f"the two runs differ (campaign/stack_check.json names the files): both kept in {work}"
    )
    assert json.loads((campaign_at(root).root / STACK_CHECK).read_text())["differing"] == [
        METRICS
    ]
    run = campaign_at(Path()).run("mrpc", "acl-cl", 1) / METRICS
    assert (work / "this" / run).read_text() == "{}"
    assert (work / "other" / run).read_text() == '{"dev": 0.5}'
    shutil.rmtree(work)


def test_a_damaged_check_is_a_one_line_error(tmp_path: Path) -> None:
    assert load_check(tmp_path / STACK_CHECK) is None  # none recorded: nothing to cite
    (tmp_path / STACK_CHECK).write_text('{"run": ')
    with pytest.raises(UserError, match=r"is not JSON .*: rerun campaign/stack_check.sh"):
        load_check(tmp_path / STACK_CHECK)


def test_a_cpu_run_names_its_cpu_where_run_json_has_it() -> None:
    assert stack({"environment": STACK}) == "cpu, torch 2.0, transformers 4.0, Python 3.11"
    named = {**STACK, "cpu": "AMD EPYC (family 25, model 17)"}
    assert stack({"environment": named}) == (
        "cpu: AMD EPYC (family 25, model 17), torch 2.0, transformers 4.0, Python 3.11"
    )
    gpu = {**named, "device": "NVIDIA H200", "cuda": "12.4"}  # the host CPU of a GPU run: not named
    assert stack({"environment": gpu}) == "NVIDIA H200, torch 2.0, CUDA 12.4, transformers 4.0, Python 3.11"
    assert stack({}) == "unrecorded"
