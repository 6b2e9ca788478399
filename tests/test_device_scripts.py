"""The lent-GPU campaign scripts (campaign/device/): what can run without a GPU.

land.sh runs in full on a scratch checkout (folders landed, kept or skipped, the dvc commit
line it prints); run.sh's checks before it trains answer with one line each. pack.sh needs
the package registry and the offline model (it was rehearsed by hand: README, "On a lent
GPU"); here its wheel list must name distributions installed in this environment, since it
downloads each at the version installed here.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEVICE = REPO / "campaign" / "device"


def _checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "campaign").mkdir(parents=True)
    shutil.copy(REPO / "campaign" / "params.yaml", root / "campaign" / "params.yaml")
    return root


def _script(name: str, root: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    full_env = {
        **os.environ,
        "ROOT": str(root),
        "PY": sys.executable,
        "PYTHONPATH": str(REPO / "src"),
        **env,
    }
    return subprocess.run(
        ["bash", str(DEVICE / name), *args], capture_output=True, text=True, env=full_env
    )


def _run_folder(tar: tarfile.TarFile, name: str, record: dict | None) -> None:
    """A run folder inside the device's tarball (as ``./<task>/<run>-s<seed>/``)."""
    folder = tarfile.TarInfo(f"./{name}")
    folder.type = tarfile.DIRTYPE
    tar.addfile(folder)
    if record is not None:
        data = json.dumps(record).encode()
        info = tarfile.TarInfo(f"./{name}/run.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _device_files(tmp_path: Path, folders: dict[str, dict | None]) -> Path:
    files = tmp_path / "files"
    files.mkdir()
    with tarfile.open(files / "runs.tar.gz", "w:gz") as tar:
        for task in {name.split("/")[0] for name in folders}:
            info = tarfile.TarInfo(f"./{task}")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, record in folders.items():
            _run_folder(tar, name, record)
    (files / "stack.txt").write_text("python 3.12.3 | torch 2.11.0 cuda 13.0\n")
    return files


def test_land_adds_new_runs_keeps_existing_skips_unfinished_and_prints_the_commit(tmp_path):
    root = _checkout(tmp_path)
    here = root / "campaign" / "runs" / "mrpc" / "ce-s1"
    here.mkdir(parents=True)
    (here / "run.json").write_text('{"where": "cpu"}')
    files = _device_files(
        tmp_path,
        {
            "mrpc/ce-s1": {"where": "gpu"},  # already recorded here: kept
            "rte/acl-cl-s2": {"where": "gpu"},  # new: landed
            "rte/acl-nograd-s3": {"where": "gpu"},  # an ablation: its stage is ablation@
            "rte/scl-s2": None,  # no run.json: not a finished run
        },
    )
    done = _script("land.sh", root, [str(files)])
    assert done.returncode == 0, done.stderr
    assert "landed 2 run folders; kept 1 already here" in done.stdout
    assert "skipped rte/scl-s2: no run.json" in done.stdout
    assert "torch 2.11.0" in done.stdout  # the device's stack is shown
    assert json.loads((here / "run.json").read_text()) == {"where": "cpu"}
    landed = root / "campaign" / "runs" / "rte" / "acl-cl-s2" / "run.json"
    assert json.loads(landed.read_text()) == {"where": "gpu"}
    assert not (root / "campaign" / "runs" / "rte" / "scl-s2").exists()
    commit = next(line.strip() for line in done.stdout.splitlines() if "dvc commit" in line)
    assert commit == (
        "dvc commit -f campaign/dvc.yaml:ablation@3-rte-acl-nograd campaign/dvc.yaml:run@2-rte-acl-cl"
    )

    again = _script("land.sh", root, [str(files)], REPLACE="1")
    assert again.returncode == 0, again.stderr
    assert "landed 3 run folders; kept 0" in again.stdout
    assert json.loads((here / "run.json").read_text()) == {"where": "gpu"}
    assert not list((root / "campaign" / "runs" / "mrpc").glob("*.landing"))


def test_land_without_the_device_files_is_one_line(tmp_path):
    root = _checkout(tmp_path)
    done = _script("land.sh", root, [str(tmp_path / "nowhere")])
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nowhere'}/runs.tar.gz not found: give the folder the run.sh "
        "call's files came back to"
    ]
    assert not (root / "campaign" / "runs").exists()


@pytest.mark.parametrize(
    ("setup", "env", "message"),
    [
        ("", {}, "OUT is not set: run.sh runs on the device machine, which sets it"),
        ("out", {}, "error: .device/b is missing: run campaign/device/pack.sh here and carry .device/b"),
        (
            "out+b",
            {},
            "error: /STASH/model.safetensors.part-a is missing: call stash.sh first "
            "(carry .device/a), then this at once",
        ),
    ],
)
def test_run_checks_before_it_trains(tmp_path, setup, env, message):
    root = _checkout(tmp_path)
    stash = tmp_path / "stash"
    extra = {"STASH": str(stash), **env}
    if "out" in setup:
        (tmp_path / "out").mkdir()
        extra["OUT"] = str(tmp_path / "out")
    else:
        extra["OUT"] = ""
    if "b" in setup:
        (root / ".device" / "b").mkdir(parents=True)
        (root / ".device" / "b" / "model.sha256").write_text("0" * 64 + "\n")
    done = _script("run.sh", root, [], **extra)
    assert done.returncode != 0
    output = (done.stdout + done.stderr).strip().splitlines()
    assert output[-1].endswith(message.replace("/STASH", str(stash))), output
    assert not (root / "campaign" / "runs").exists()  # nothing written before the checks pass


def test_every_carried_wheel_is_installed_here():
    """pack.sh downloads each listed distribution at the version installed here."""
    names = [
        line.strip()
        for line in (DEVICE / "wheels.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert "dvclive" in names and len(names) == len(set(names))
    for name in names:
        assert importlib.metadata.version(name)
