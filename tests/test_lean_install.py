"""`pip install aclpipe` (the core, no extras) into a fresh virtual environment: torch, DVC and
matplotlib are not there, `aclpipe predict --engine onnx` answers as the full install's PyTorch
engine does on the same export, `aclpipe serve` answers as predict does, and a command that
needs an extra names it in one line.

Slow: it builds the package and installs its core dependencies from the package index (or
pip's cache) into the new environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from paths import REPO
from test_export import trained_folders

from aclpipe.data.tasks import TASKS
from aclpipe.early_exit.predict import predict_lines
from aclpipe.exits.export import export_exits

LINES = ["good", "the movie was bad .", "a dog sits on the mat", "bad plot .", "it was fun"]
# the extras' top-level modules, none of which the core may bring
LEFT_OUT = ["torch", "transformers", "dvc", "matplotlib", "sklearn", "scipy", "datasets"]


@pytest.fixture(scope="module")
def core_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding `pip install <this tree>`, built from a copy of the tree's package
    files (so the build writes nothing into the checkout)."""
    root = tmp_path_factory.mktemp("core-install")
    tree = root / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(
        REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(tree)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("core-export")
    model_dir, data_dir = trained_folders(root, tiny_model_dir, "mean")
    export_exits(TASKS["sst2"], model_dir, data_dir, root / "export", batch_size=4)
    return root / "export"


def run(venv: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / "aclpipe"), *args], input=stdin, text=True,
                          capture_output=True, env=env, cwd=venv.parent)  # fmt: skip


@pytest.mark.slow
def test_the_core_leaves_the_extras_out(core_env: Path):
    for module in LEFT_OUT:
        probe = subprocess.run([str(core_env / "bin" / "python"), "-c", f"import {module}"],
                               capture_output=True)  # fmt: skip
        assert probe.returncode != 0, f"{module} is importable in the core install"


@pytest.mark.slow
@pytest.mark.parametrize(
    "setting", [[], ["--policy", "none"], ["--policy", "confidence", "--threshold", "0.5"]]
)
def test_predict_onnx_in_the_core_answers_as_the_torch_engine(core_env, export_dir, setting):
    done = run(core_env, "predict", "--model", str(export_dir), "--engine", "onnx", *setting,
               stdin="\n".join(LINES) + "\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    policy = setting[1] if setting else None
    threshold = float(setting[3]) if len(setting) > 2 else None
    reference = list(predict_lines(export_dir, LINES, policy, threshold, engine="torch"))
    assert [r["text"] for r in rows] == LINES
    for got, want in zip(rows, reference):
        assert (got["label"], got["exit_layer"]) == (want["label"], want["exit_layer"])
        assert got["probability"] == pytest.approx(want["probability"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["finetune", "--task", "sst2", "--method", "ce"], "train"),
        (["predict", "--model", "MODEL", "--engine", "torch"], "train"),
    ],
)
def test_a_missing_extra_is_named_in_one_line(core_env, export_dir, args, extra):
    args = [str(export_dir / "model") if a == "MODEL" else a for a in args]
    done = run(core_env, *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: this needs torch, which the core install leaves out: pip install 'aclpipe[{extra}]'"
    ]


@pytest.mark.slow
def test_serve_in_the_core_answers_as_predict(core_env, export_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    server = subprocess.Popen(
        [str(core_env / "bin" / "aclpipe"), "serve", "--model", str(export_dir), "--port", "0"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    try:
        port = None
        for line in server.stderr:  # the start-up line names the port, once the engine is warm
            if match := re.search(r"http://127\.0\.0\.1:(\d+)", line):
                port = int(match.group(1))
                break
        assert port, f"serve did not start: exit code {server.poll()}"
        body = json.dumps([{"text": text} for text in LINES]).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body)
        with urllib.request.urlopen(request, timeout=30) as answer:
            served = json.loads(answer.read())
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    predicted = run(core_env, "predict", "--model", str(export_dir), stdin="\n".join(LINES) + "\n")
    rows = [json.loads(line) for line in predicted.stdout.splitlines()]
    assert [(r["label"], r["exit_layer"]) for r in served] == [
        (r["label"], r["exit_layer"]) for r in rows
    ]
    for got, want in zip(served, rows):
        assert got["probability"] == pytest.approx(want["probability"], abs=1e-6)
