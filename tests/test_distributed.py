"""Two processes at batch b train like one process at batch 2b (torchrun, gloo on the CPU).

With dropout off everywhere (backbone and exit heads) both runs compute the same function on
the same global batches, so only float rounding may separate them: ``ce`` through DDP's
gradient average of locally weighted means, ``acl`` through the gathered contrastive pool
and ACL-Grad deciding on the averaged gradients. Checkpoints, models and logs must be written
once, by the main process.

The scale-out tests run 3 and 4 processes over tails of every size from 1 to 2P rows (one
torchrun launch per P trains every configuration in turn, ``scale_out_driver.py``), in
float64, against one process at the same global batch.
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
from paths import at
from safetensors.torch import load_file
from typer.testing import CliRunner

from aclpipe.cli import app
from aclpipe.layout import MODEL_CONFIG, WEIGHTS, split_file
from aclpipe.run_log import read_run_log

pytestmark = pytest.mark.slow

METHODS = ("ce", "acl")
BATCH = 4  # per process; 48 training rows = 6 global batches of 8
MODEL_FILES = {
    WEIGHTS,
    MODEL_CONFIG,
    "tokenizer",
    "dvclive",
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
        # grouped by length: every process builds the same grouped global batch, sorted longest
        # first, then takes its shard (48 rows at 8 make one-batch mega-batches, so this checks
        # the sort and the sharding; tests/test_batch_order.py the grouping across batches; the
        # plain shuffle is covered by the scale-out runs below)
        "train": {"epochs": 1, "save_every": 1, "group_by_length": True},
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
    return at(work).model("sst2", method)


def steps(work: Path, method: str) -> list[dict]:
    return read_run_log(model_dir(work, method)).steps


@pytest.mark.parametrize("method", METHODS)
def test_same_weights(runs: dict, method: str) -> None:
    two = load_file(model_dir(runs["two"], method) / WEIGHTS)
    one = load_file(model_dir(runs["one"], method) / WEIGHTS)
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
    logs = [read_run_log(model_dir(w, method)) for w in (runs["two"], runs["one"])]
    assert [log.run["processes"] for log in logs] == [2, 1]
    scores = [[s for e in log.history for s in e["dev_scores"]] for log in logs]
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
        assert [e["epoch"] for e in read_run_log(folder).history] == [1]
    assert out.count("stage 1 epoch 1 dev score") == len(METHODS)
    # checkpoints after every step, all removed at the end; no temporary left behind
    assert sorted(p.name for p in at(runs["two"]).models("sst2").iterdir()) == sorted(METHODS)


# Scale-out: 3 and 4 processes at 3 rows each (global batches of 9 and 12), one epoch of a
# full global batch and a tail. Each tail size from 1 to 2P occurs once per P: tails of at
# least P rows are kept (shards like [2, 1, 1]), shorter ones are dropped. Every run must
# end with the weights of one process at the global batch that sees the same rows.
PER_PROCESS = 3
SEPARATE = {"model": {"label_embedding": "separate"}}
ACL_SUM = {"methods": {"acl": {"acl_grad": False}}}  # DDP's own backward (plain sum)
ACL_CL_SUM = {"methods": {"acl-cl": {"acl_grad": False}}}
SCALE_OUT = {  # processes: [(method, tail rows, extra params sections), ...]
    3: [
        ("ce", 4, {}),
        ("acl", 5, {}),
        ("acl-cl", 6, {}),
        ("deebert", 3, {}),
        ("acl", 4, {**SEPARATE, **ACL_SUM}),
        ("ce", 1, {}),
        ("acl-cl", 2, SEPARATE),
    ],
    4: [
        ("ce", 6, {}),
        ("acl", 7, {}),
        ("acl-cl", 5, {}),
        ("deebert", 8, {}),
        ("acl-cl", 4, {**SEPARATE, **ACL_CL_SUM}),
        ("acl", 1, SEPARATE),
        ("deebert", 2, {}),
        ("ce", 3, {}),
    ],
}


def scale_out_name(processes: int, method: str, tail: int, extra: dict) -> str:
    return f"p{processes}-{method}-tail{tail}" + ("-separate" if "model" in extra else "")


def scale_out_params(params_dict, model: Path, batch: int, extra: dict) -> dict:
    sections = {
        "model": {"name": str(model), "dropout": 0.0, **extra.get("model", {})},
        "train": {"epochs": 1, "batch_size": batch, "save_every": 0},
    }
    raw = params_dict(None, **sections)
    raw["methods"] = extra.get("methods", {})
    return raw


def truncated_data(source: Path, folder: Path, rows: int) -> Path:
    """A prepared SST-2 folder whose train split keeps its first ``rows`` examples."""
    shutil.copytree(source, folder)
    lines = split_file(source, "train").read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(lines) >= rows
    split_file(folder, "train").write_text("".join(lines[:rows]), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def scale_out(tmp_path_factory, make_project, params_dict, tiny_model_dir_no_dropout: Path):
    """Every run of ``SCALE_OUT`` by P processes (one torchrun launch per P), and the same
    run by one process at batch P x 3 (in this process, dropping the same short tails)."""
    from aclpipe.data.tasks import get_task
    from aclpipe.stages.finetune import finetune
    from aclpipe.training import loop

    launcher = torchrun()
    if launcher is None:
        pytest.skip("torchrun cannot run here: torch.distributed with gloo is unavailable")
    work = tmp_path_factory.mktemp("scale-out")
    model = {"name": str(tiny_model_dir_no_dropout)}
    prepared = at(make_project(work / "project", model=model)).data("sst2")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    source = Path(loop.__file__).parents[2]  # the workers import this aclpipe
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    runs = {}
    for processes, configs in SCALE_OUT.items():
        global_batch = processes * PER_PROCESS
        plan = []
        for method, tail, extra in configs:
            name = scale_out_name(processes, method, tail, extra)
            data = truncated_data(prepared, work / name / "data", global_batch + tail)
            raw = scale_out_params(params_dict, tiny_model_dir_no_dropout, PER_PROCESS, extra)
            out = str(work / name / "many" / "model")
            plan.append({"name": name, "method": method, "params": raw, "data": str(data)})
            plan[-1]["out"] = out
            runs[name] = {"processes": processes, "method": method, "tail": tail}
            runs[name].update(data=data, extra=extra, many=Path(out))
        plan_path = work / f"plan-{processes}.json"
        plan_path.write_text(json.dumps({"runs": plan, "float64": True}), encoding="utf-8")
        command = [
            *launcher, "--nproc_per_node", str(processes), "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), str(Path(__file__).with_name("scale_out_driver.py")),
            str(plan_path),
        ]  # fmt: skip
        launched = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        errors = [line for line in launched.stderr.splitlines() if "Error" in line]
        assert launched.returncode == 0, "\n".join(errors[:20]) + launched.stderr[-3000:]
        shards = [json.loads((work / f"shards-{r}.json").read_text()) for r in range(processes)]
        for name in (p["name"] for p in plan):
            runs[name]["shards"] = [per_rank[name] for per_rank in shards]
    from aclpipe.config import params_from_dict

    sys.path.insert(0, str(Path(__file__).parent))
    from scale_out_driver import in_float64

    dtype = torch.get_default_dtype()
    for name, run in runs.items():
        processes, extra = run["processes"], run["extra"]
        raw = scale_out_params(
            params_dict, tiny_model_dir_no_dropout, processes * PER_PROCESS, extra
        )
        run["one"] = work / name / "one" / "model"
        with pytest.MonkeyPatch.context() as mp:
            if run["tail"] < processes:  # P processes drop it; so must the reference
                mp.setattr(loop, "global_batches", lambda n, batch, *_: n // batch)
            mp.setattr(loop, "load_encoder", loop.load_encoder)  # in_float64 replaces it
            try:
                in_float64()
                finetune(
                    get_task("sst2"), run["method"], params_from_dict(raw), run["data"], run["one"]
                )
            finally:
                torch.set_default_dtype(dtype)
    return runs


SCALE_OUT_RUNS = [
    scale_out_name(p, method, tail, extra)
    for p, configs in SCALE_OUT.items()
    for method, tail, extra in configs
]


def test_scale_out_covers_every_tail() -> None:
    for processes, configs in SCALE_OUT.items():
        assert {tail for _, tail, _ in configs} == set(range(1, 2 * processes + 1))
        assert {m for m, tail, _ in configs if tail >= processes} >= {"ce", "acl", "acl-cl"}


@pytest.mark.parametrize("name", SCALE_OUT_RUNS)
def test_scale_out_shards_and_steps(scale_out: dict, name: str) -> None:
    """No process trains on an empty shard; the shards of a step make its global batch; a tail
    shorter than the number of processes is dropped."""
    run = scale_out[name]
    processes, tail = run["processes"], run["tail"]
    stages = 2 if run["method"] == "deebert" else 1
    expected = ([processes * PER_PROCESS] + ([tail] if tail >= processes else [])) * stages
    per_step = list(zip(*run["shards"], strict=True))
    assert [sum(step) for step in per_step] == expected
    assert all(min(step) >= 1 and max(step) - min(step) <= 1 for step in per_step), per_step
    assert [r["step"] for r in steps_at(run["many"])] == list(range(1, len(expected) + 1))
    assert [r["step"] for r in steps_at(run["one"])] == list(range(1, len(expected) + 1))


@pytest.mark.parametrize("name", SCALE_OUT_RUNS)
def test_scale_out_same_weights_as_one_process(scale_out: dict, name: str) -> None:
    """In float64 (``scale_out_driver.in_float64``) only rounding may separate the runs: the
    bound 1e-10 is far below a step's size, so a parameter that one process leaves alone and
    P processes move by weight decay or momentum alone (about 1e-6 a step here) shows."""
    run = scale_out[name]
    many = load_file(run["many"] / WEIGHTS)
    one = load_file(run["one"] / WEIGHTS)
    assert many.keys() == one.keys()
    diff = {k: (many[k] - one[k]).abs().max().item() for k in one}
    print(f"{name}: max weight difference {max(diff.values()):.2e}")
    assert {k: d for k, d in diff.items() if d > 1e-10} == {}


def steps_at(folder: Path) -> list[dict]:
    return read_run_log(folder).steps
