"""Two processes at batch b train like one process at batch 2b (torchrun, gloo on the CPU).

With dropout off everywhere (backbone and exit heads) both runs compute the same function on
the same global batches, so only float rounding may separate them: ``ce`` through DDP's
gradient average of locally weighted means, ``acl`` through the gathered contrastive pool
and ACL-Grad deciding on the averaged gradients. Checkpoints, models and logs must be written
once, by the main process.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from typer.testing import CliRunner

from aclpipe.cli import app

pytestmark = pytest.mark.slow

METHODS = ("ce", "acl")
BATCH = 4  # per process; 48 training rows = 6 global batches of 8
MODEL_FILES = {
    "model.safetensors",
    "aclpipe_model.json",
    "tokenizer",
    "history.json",
    "steps.jsonl",
}


def torchrun() -> list[str] | None:
    """How to start torchrun from this environment; None when it cannot run here."""
    if not (dist.is_available() and dist.is_gloo_available()):
        return None
    script = Path(sys.executable).parent / "torchrun"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "torch.distributed.run"] if shutil.which(sys.executable) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def aclpipe_command() -> list[str]:
    script = Path(sys.executable).parent / "aclpipe"
    return [str(script)] if script.exists() else ["-m", "aclpipe.cli"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, make_project, tiny_model_dir_no_dropout: Path):
    """The same params trained by 2 processes x batch b (torchrun) and 1 x batch 2b."""
    launcher = torchrun()
    if launcher is None:
        pytest.skip(
            "torchrun cannot run here: torch.distributed with the gloo backend is unavailable"
        )
    sections = {
        "pipeline": {"methods": list(METHODS)},
        "model": {"name": str(tiny_model_dir_no_dropout), "dropout": 0.0},
        "train": {"epochs": 1, "save_every": 1},
    }
    two = make_project(tmp_path_factory.mktemp("two-processes"), **sections)
    one = make_project(tmp_path_factory.mktemp("one-process"), **sections)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    env.pop("GLUE_DIR", None)
    command = [
        *launcher, "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), *aclpipe_command(),
        "finetune", "--task", "sst2", "--set", f"train.batch_size={BATCH}",
    ]  # fmt: skip
    launched = subprocess.run(
        command, cwd=two, env=env, capture_output=True, text=True, timeout=600
    )
    assert launched.returncode == 0, launched.stdout + launched.stderr
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(one)
        args = ["finetune", "--task", "sst2", "--set", f"train.batch_size={2 * BATCH}"]
        single = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        assert single.exit_code == 0, single.output
    return {"two": two, "one": one, "stdout": launched.stdout}


def model_dir(work: Path, method: str) -> Path:
    return work / "models" / "sst2" / method


def steps(work: Path, method: str) -> list[dict]:
    lines = (model_dir(work, method) / "steps.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("method", METHODS)
def test_same_weights(runs: dict, method: str) -> None:
    two = load_file(model_dir(runs["two"], method) / "model.safetensors")
    one = load_file(model_dir(runs["one"], method) / "model.safetensors")
    assert two.keys() == one.keys()
    far = {
        k: (two[k] - one[k]).abs().max().item()
        for k in one
        if not torch.allclose(two[k], one[k], atol=1e-5, rtol=1e-4)
    }
    assert far == {}


@pytest.mark.parametrize("method", METHODS)
def test_same_dev_scores_and_schedule(runs: dict, method: str) -> None:
    two, one = steps(runs["two"], method), steps(runs["one"], method)
    assert [r["step"] for r in two] == [r["step"] for r in one] == list(range(1, 7))
    assert [r["lr"] for r in two] == [r["lr"] for r in one]
    histories = [
        json.loads((model_dir(w, method) / "history.json").read_text())
        for w in (runs["two"], runs["one"])
    ]
    assert [h["processes"] for h in histories] == [2, 1]
    scores = [[s for e in h["epochs"] for s in e["dev_scores"]] for h in histories]
    assert scores[0] == pytest.approx(scores[1], abs=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_same_logged_losses(runs: dict, method: str) -> None:
    two, one = steps(runs["two"], method), steps(runs["one"], method)
    for key in ("loss", "main", "aux")[: 3 if method == "acl" else 2]:
        got, want = [r.get(key) for r in two], [r.get(key) for r in one]
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5), key


def test_same_acl_grad_decisions(runs: dict) -> None:
    two, one = steps(runs["two"], "acl"), steps(runs["one"], "acl")
    assert [r["altered"] for r in two] == [r["altered"] for r in one]
    assert [r["cosine"] for r in two] == pytest.approx([r["cosine"] for r in one], abs=1e-4)
    assert all(-1 <= r["cosine"] <= 1 for r in two)


def test_written_once_by_the_main_process(runs: dict) -> None:
    out = runs["stdout"]
    for method in METHODS:
        assert out.count(f"saved models/sst2/{method}\n") == 1
        assert out.count(f"{method} stage 1/1 step 6/6") == 1
        folder = model_dir(runs["two"], method)
        assert {p.name for p in folder.iterdir()} == MODEL_FILES
        assert [r["step"] for r in steps(runs["two"], method)] == list(range(1, 7))
        history = json.loads((folder / "history.json").read_text())
        assert [e["epoch"] for e in history["epochs"]] == [1]
    assert out.count("stage 1 epoch 1 dev score") == len(METHODS)
    # checkpoints after every step, all removed at the end; no temporary left behind
    assert sorted(p.name for p in (runs["two"] / "models" / "sst2").iterdir()) == sorted(METHODS)
