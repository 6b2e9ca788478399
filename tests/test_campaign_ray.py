"""The campaign runner on Ray (``run-pending --backend ray``): the same files as the local pool,
a worker killed mid-run retried and resumed from its checkpoint, and one-line errors.

The slow tests start a small local Ray cluster in this process (2 CPUs, no dashboard), shared
by the module and shut down after it; the fast ones need no cluster.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from cli_helpers import invoke, tree
from rich.console import Console

from aclpipe.errors import UserError
from aclpipe.study.campaign.plan import load_campaign
from aclpipe.study.campaign.runner import _run_logged, run_pending
from aclpipe.study.campaign.runs import prepare_task

FLAG = ["--campaign", "campaign/params.yaml"]


def write_campaign(folder: Path, base: dict, prepare: bool = True, **spec) -> Path:
    """``folder/campaign/params.yaml`` for the tiny model (sst2; ce and joint; seeds 1 and 2),
    with sst2 prepared into ``folder/campaign/data/sst2``."""
    campaign = {"tasks": ["sst2"], "seeds": [1, 2], "runs": ["ce", "joint"], **spec}
    path = folder / "campaign" / "params.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**base, "campaign": campaign}), encoding="utf-8")
    if prepare:
        prepare_task(load_campaign(path), "sst2", Console(file=io.StringIO()))
    return path


def closed_port() -> int:
    """A port on this machine that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- without a cluster ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "resources, message",
    [
        ({"cpus": 0}, "campaign.resources.cpus in .* must be a whole number >= 1, got 0"),
        (
            {"gpus": 1.5},
            "campaign.resources.gpus in .* must be 0, a fraction of one GPU .* got 1.5",
        ),
        ({"gpus": True}, "campaign.resources.gpus in .* must be 0, .* got True"),
        ({"memory": 4}, "campaign.resources in .* takes cpus .* and gpus"),
    ],
)
def test_bad_resources_are_one_line(tmp_path: Path, params_dict, resources, message) -> None:
    path = write_campaign(tmp_path, params_dict(None), prepare=False, resources=resources)
    with pytest.raises(UserError, match=message):
        load_campaign(path)


def test_resources_are_read(tmp_path: Path, params_dict) -> None:
    path = write_campaign(tmp_path, params_dict(None), False, resources={"cpus": 4, "gpus": 0.25})
    resources = load_campaign(path).resources
    assert (resources.cpus, resources.gpus) == (4, 0.25)
    path = write_campaign(tmp_path, params_dict(None), prepare=False)
    assert (load_campaign(path).resources.cpus, load_campaign(path).resources.gpus) == (1, 0)


def one_line_error(tmp_path: Path, monkeypatch, *args: str) -> str:
    monkeypatch.chdir(tmp_path)
    result = invoke("campaign", "run-pending", *args, *FLAG)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    return result.output


def test_backend_errors_are_one_line(tmp_path: Path, params_dict, monkeypatch) -> None:
    write_campaign(tmp_path, params_dict(None), prepare=False)
    out = one_line_error(tmp_path, monkeypatch, "--backend", "dask")
    assert "--backend 'dask': use local or ray" in out
    out = one_line_error(tmp_path, monkeypatch, "--address", "auto")
    assert "--address names a Ray cluster: add --backend ray" in out
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    out = one_line_error(tmp_path, monkeypatch, "--backend", "ray")
    assert "--backend ray needs Ray, which is not installed: pip install 'aclpipe[cluster]'" in out


def test_address_with_nothing_listening_is_one_line(
    tmp_path: Path, params_dict, monkeypatch
) -> None:
    pytest.importorskip("ray")
    write_campaign(tmp_path, params_dict(None), prepare=False)
    port = closed_port()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        start = time.perf_counter()
        out = one_line_error(tmp_path, monkeypatch, "--backend", "ray", "--address", address)
        assert f"--address {address}: nothing answers there" in out, out
        assert "ray start --head" in out
        assert time.perf_counter() - start < 10  # Ray alone retries for minutes
    out = one_line_error(tmp_path, monkeypatch, "--backend", "ray", "--address", "head")
    assert "--address 'head': give auto, host:port or ray://host:port" in out


# --- on a local cluster -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray instance in this process: 2 CPUs, no dashboard; shut down after the module."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_writes_the_local_pools_files(
    tmp_path: Path, params_dict, glue_dir: Path, monkeypatch, ray_cluster
) -> None:
    """Four runs on each backend: the same run folders, byte for byte, and the same commit."""
    local = tmp_path / "local"
    write_campaign(local, params_dict(glue_dir))
    shutil.copytree(local, tmp_path / "ray")  # the same prepared data
    outputs = {}
    for name, args in (("local", ["--workers", "2"]), ("ray", ["--backend", "ray"])):
        monkeypatch.chdir(tmp_path / name)
        result = invoke("campaign", "run-pending", "--threads", "1", *args, *FLAG)
        assert result.exit_code == 0, result.output
        outputs[name] = result.output
    runs = {name: tree(tmp_path / name / "campaign" / "runs") for name in ("local", "ray")}
    assert len([p for p in runs["local"] if p.endswith("run.json")]) == 4
    assert runs["ray"] == runs["local"]  # every file's bytes, and no leftover .tmp- folder
    out = outputs["ray"]
    assert "4 runs to do, as Ray tasks on this machine, each asking 1 CPU" in out
    assert re.search(r"running sst2 joint seed 2 \(node [\d.]+, pid \d+\)", out), out
    assert "(4/4); pending 0, running 0, done 4, failed 0" in out
    assert out.count("done sst2 ") == 4
    commit = [line for line in outputs["local"].splitlines() if "dvc commit -f" in line]
    assert commit and commit[0] in out  # the same stages to record
    assert ray_cluster.is_initialized()  # the runner leaves a cluster it did not start


@pytest.mark.slow
def test_a_killed_worker_is_retried_and_resumes(
    tmp_path: Path, params_dict, glue_dir: Path, monkeypatch, ray_cluster
) -> None:
    """SIGKILL the worker of one run once it has a checkpoint: Ray runs it again, the run
    resumes from the checkpoint, and its folder is the one an uninterrupted run writes."""
    base = params_dict(glue_dir, train={"epochs": 40, "save_every": 2})  # 120 steps
    work = tmp_path / "work"
    path = write_campaign(work, base, runs=["ce"])
    shutil.copytree(work, tmp_path / "reference")
    monkeypatch.chdir(work)
    campaign = load_campaign(path.relative_to(work))
    checkpoint = Path("campaign/models/sst2/.ce-s1.checkpoint")
    console_file = io.StringIO()
    killed: list[int] = []

    def kill_when_checkpointed() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            found = re.search(
                r"running sst2 ce seed 1 \(node [\d.]+, pid (\d+)\)", console_file.getvalue()
            )
            if found and (work / checkpoint).exists():
                os.kill(int(found.group(1)), signal.SIGKILL)
                killed.append(int(found.group(1)))
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_when_checkpointed, daemon=True)
    watcher.start()
    done, failed = run_pending(
        campaign, 1, Console(file=console_file, width=200), threads=1, backend="ray"
    )
    watcher.join()
    out = console_file.getvalue()
    assert killed, out
    assert failed == [] and sorted(map(str, done)) == [
        "campaign/runs/sst2/ce-s1",
        "campaign/runs/sst2/ce-s2",
    ]  # each run recorded once
    assert re.search(r"running sst2 ce seed 1 \(node [\d.]+, pid \d+\) again: its worker", out), out
    assert "(2/2); pending 0, running 0, done 2, failed 0" in out
    log = (work / "campaign/models/sst2/ce-s1.log").read_text(encoding="utf-8")
    assert "resuming ce on sst2 from" in log  # the retry started from the checkpoint
    assert not [p for p in (work / "campaign/runs/sst2").iterdir() if p.name.startswith(".")]
    monkeypatch.chdir(tmp_path / "reference")  # the same run, uninterrupted, in this process
    _run_logged("campaign/params.yaml", "run", "sst2", "ce", 1, 1)
    reference = tree(tmp_path / "reference/campaign/runs/sst2/ce-s1")
    assert tree(work / "campaign/runs/sst2/ce-s1") == reference


@pytest.mark.slow
def test_a_run_no_node_can_hold_is_one_line(
    tmp_path: Path, params_dict, glue_dir: Path, monkeypatch, ray_cluster
) -> None:
    write_campaign(tmp_path, params_dict(glue_dir), resources={"gpus": 1})
    out = one_line_error(tmp_path, monkeypatch, "--backend", "ray")
    assert "each run asks 1 CPUs and 1 GPUs, more than any node of the cluster has" in out
    assert "(the largest: 2 CPUs, 0 GPUs)" in out
    assert not (tmp_path / "campaign" / "runs").exists()


@pytest.mark.slow
def test_a_failed_run_does_not_stop_the_others(
    tmp_path: Path, params_dict, glue_dir: Path, monkeypatch, ray_cluster
) -> None:
    """One run raises (a run the campaign does not know): it fails in one line, its log keeps
    the traceback, and the other run finishes."""
    from aclpipe.study.campaign.backends import Job, RunResources, follow
    from aclpipe.study.campaign.ray_backend import RayCluster

    write_campaign(tmp_path, params_dict(glue_dir), seeds=[1], runs=["ce"])
    monkeypatch.chdir(tmp_path)
    args = ("campaign/params.yaml", "run", "sst2")
    jobs = [
        Job(
            "sst2 bogus seed 1", "campaign/runs/sst2/bogus-s1", _run_logged, (*args, "bogus", 1, 1)
        ),
        Job("sst2 ce seed 1", "campaign/runs/sst2/ce-s1", _run_logged, (*args, "ce", 1, 1)),
    ]
    console_file = io.StringIO()
    console = Console(file=console_file, width=200)
    done, failed = follow(RayCluster(None, RunResources()), jobs, console)
    out = console_file.getvalue()
    assert [str(p) for p in done] == ["campaign/runs/sst2/ce-s1"], out
    assert failed == [
        "sst2 bogus seed 1: UserError: unknown run 'bogus': campaign.runs in "
        "campaign/params.yaml lists ce"
    ]
    assert f"failed {failed[0]}; pending " in out
    assert "pending 0, running 0, done 1, failed 1" in out.splitlines()[-1]
    assert "Traceback" in Path("campaign/models/sst2/bogus-s1.log").read_text(encoding="utf-8")
