"""Resumable fine-tuning: kill a run at any moment, run it again, land on the same bits.

A run killed with SIGKILL (even half-way through a checkpoint write) and started again
continues from the last complete checkpoint, says so, and ends with weights, step log and dev
scores bitwise identical to an uninterrupted run with the same seed on the CPU.

Every kill is a real SIGKILL of a real process. Most runs are forked from this (already warm)
interpreter, so that a run is under way in milliseconds rather than the ~10 s a fresh one
takes to import torch; one slow test does the same to ``python -m aclpipe.cli`` as a user
starts it. Random kills come at a seeded random step and a random point inside it; kills at
chosen points (half-way through a checkpoint file, between two renames, at the stage
boundary) come from a patch in the forked child that sends it SIGKILL there.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_helpers import invoke, ok, tree
from paths import RELATIVE, at
from safetensors.torch import load_file

from aclpipe.cli import app
from aclpipe.errors import UserError
from aclpipe.layout import MODEL_CONFIG, TRAINING_LOG, WEIGHTS, checkpoint_dir
from aclpipe.run_log import read_run_log
from aclpipe.training import checkpoint as ckpt
from aclpipe.training.checkpoint import Position, TrainingState, load_checkpoint, save_checkpoint
from aclpipe.training.loop import linear_schedule

# 48 training rows in batches of 4: 12 steps per epoch, 24 in all.
TRAIN = {"epochs": 2, "batch_size": 4}
FINETUNE = ("finetune", "--task", "sst2", "--method", "joint")
SAVE_EVERY_STEP = ("--set", "train.save_every=1")
CHECKPOINT = checkpoint_dir(RELATIVE.model("sst2", "joint"))
START_TIMEOUT_S = 180  # a fresh interpreter imports torch and transformers on a busy machine


def sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def assert_same_run(model_dir: Path, reference: Path) -> None:
    """Weights bitwise equal; history (dev scores per epoch) and step log byte-identical."""
    got, want = (
        load_file(model_dir / WEIGHTS),
        load_file(reference / WEIGHTS),
    )
    assert got.keys() == want.keys()
    assert [k for k in want if not torch.equal(got[k], want[k])] == []
    assert tree(model_dir / TRAINING_LOG) == tree(reference / TRAINING_LOG)


def resumed_from(output: str, method: str = "joint") -> str:
    """The resume line of a run's output (asserting there is exactly one)."""
    lines = [line for line in output.splitlines() if line.startswith("resuming")]
    assert len(lines) == 1, output
    assert lines[0].startswith(f"resuming {method} on sst2 from models/sst2/.{method}.checkpoint:")
    return lines[0]


def checkpoint_step(folder: Path) -> int | None:
    """The global step of the complete checkpoint in ``folder``; None when there is none."""
    try:
        state = json.loads((folder / ckpt.STATE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):  # none yet, or being replaced right now
        return None
    return state["position"]["global_step"]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith((".tmp-", ".old-")))


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory: pytest.TempPathFactory, make_project) -> dict[str, Path]:
    """Uninterrupted runs (no checkpoints between epochs' ends), in process: joint and deebert."""
    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        for method in ("joint", "deebert"):
            work = make_project(tmp_path_factory.mktemp(f"reference-{method}"), train=TRAIN)
            mp.chdir(work)
            ok("finetune", "--task", "sst2", "--method", method)
            runs[method] = at(work).model("sst2", method)
    return runs


# SIGKILL at random moments -------------------------------------------------------------


def _wait_until(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.005) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(poll_s)


class Run:
    """A finetune run in another process, its output going to ``log``.

    ``Run.spawn`` forks this (already warm) interpreter and calls the CLI in the child, so a
    run is under way in milliseconds; ``Run.start`` starts ``python -m aclpipe.cli`` afresh.
    """

    def __init__(self, work: Path, log: Path, args: tuple[str, ...]) -> None:
        self.work, self.log, self.args = work, log, args
        self.pid: int | None = None
        self.proc: subprocess.Popen | None = None
        self.code: int | None = None

    def spawn(self) -> Run:
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.chdir(self.work)
                os.environ["COLUMNS"] = "200"  # rich wraps at 80 columns when not on a terminal
                sys.stdout = sys.stderr = open(self.log, "w", buffering=1, encoding="utf-8")
                app(list(self.args), prog_name="aclpipe")
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
            finally:
                os._exit(code)
        return self

    def start(self, env: dict) -> Run:
        command = [sys.executable, "-m", "aclpipe.cli", *self.args]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                command, cwd=self.work, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    def poll(self) -> int | None:
        if self.code is None and self.proc is not None:
            self.code = self.proc.poll()
        elif self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def kill(self) -> int:
        """SIGKILL (unless it has ended already); the exit code, -9 when the kill took."""
        if self.poll() is None:
            os.kill(self.proc.pid if self.proc else self.pid, signal.SIGKILL)
            _wait_until(lambda: self.poll() is not None, 60)
        return self.code

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


def kill_after_progress(run: Run, steps: int, jitter_s: float | None, timeout_s: float = 60) -> int:
    """SIGKILL ``run`` once it has checkpointed ``steps`` steps past where it started, then
    ``jitter_s`` seconds later (a random point inside the next step), or (None) as soon as its
    next checkpoint write is under way. Counting steps, not seconds, keeps the kills inside
    the run on a fast machine as on a slow one. Returns the exit code."""
    checkpoint = run.work / CHECKPOINT
    target = (checkpoint_step(checkpoint) or 0) + steps
    _wait_until(
        lambda: run.poll() is not None or (checkpoint_step(checkpoint) or 0) >= target, timeout_s
    )
    if jitter_s is None:
        writing = f".tmp-{checkpoint.name}-*"
        _wait_until(
            lambda: run.poll() is not None or any(checkpoint.parent.glob(writing)), 30, 0.0002
        )
    else:
        time.sleep(jitter_s)
    return run.kill()


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(
    make_project, reference_runs: dict[str, Path], tmp_path: Path
) -> None:
    """Killed four times (once as soon as a checkpoint write starts), resumed each time."""
    work = make_project(tmp_path / "killed", train=TRAIN)
    checkpoint = work / CHECKPOINT
    rng = random.Random(3)
    outputs, steps_at_kill, hit_mid_write = [], [], False
    for attempt in range(4):
        run = Run(work, tmp_path / f"attempt-{attempt}.log", (*FINETUNE, *SAVE_EVERY_STEP))
        steps, jitter_s = rng.randint(1, 4), rng.uniform(0.0, 0.05)
        code = kill_after_progress(run.spawn(), steps, None if attempt == 1 else jitter_s)
        outputs.append(run.output())
        assert code == -signal.SIGKILL, outputs[-1]  # 4 kills of at most 5 steps: inside 24
        hit_mid_write |= any(checkpoint.parent.glob(f".tmp-{checkpoint.name}-*"))
        steps_at_kill.append(checkpoint_step(checkpoint))
        assert steps_at_kill[-1] is not None, "a kill must leave a complete checkpoint"
        assert not (at(work).model("sst2", "joint") / MODEL_CONFIG).exists()
    final = Run(work, tmp_path / "final.log", (*FINETUNE, *SAVE_EVERY_STEP)).spawn()
    _wait_until(lambda: final.poll() is not None, 300, 0.05)
    assert final.code == 0, final.output()
    outputs.append(final.output())
    # every run after a kill resumed from exactly the checkpoint that kill left
    assert "resuming" not in outputs[0]
    for step, output in zip(steps_at_kill, outputs[1:]):
        assert resumed_from(output).endswith(f"(step {step})"), (step, output)
    assert steps_at_kill == sorted(steps_at_kill)
    model_dir = at(work).model("sst2", "joint")
    assert_same_run(model_dir, reference_runs["joint"])
    assert not checkpoint.exists()
    assert not [n for n in leftovers(model_dir.parent) if n.startswith((".tmp-.", ".old-"))]
    print(
        f"killed at steps {steps_at_kill}; a kill left a half-written checkpoint: {hit_mid_write}"
    )


@pytest.mark.slow
def test_sigkill_of_a_fresh_interpreter_then_resume(
    make_project, reference_runs: dict[str, Path], tmp_path: Path, monkeypatch
) -> None:
    """The same through ``python -m aclpipe.cli`` as a user runs it: one kill, one resume."""
    work = make_project(tmp_path / "killed", train=TRAIN)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    env.pop("GLUE_DIR", None)
    run = Run(work, tmp_path / "killed.log", (*FINETUNE, *SAVE_EVERY_STEP)).start(env)
    rng = random.Random(99)
    code = kill_after_progress(run, rng.randint(1, 8), rng.uniform(0.0, 0.05), START_TIMEOUT_S)
    assert code == -signal.SIGKILL, run.output()
    step = checkpoint_step(work / CHECKPOINT)
    assert step is not None and not at(work).model("sst2", "joint").exists()
    monkeypatch.chdir(work)
    assert resumed_from(ok(*FINETUNE)).endswith(f"(step {step})")
    assert_same_run(at(work).model("sst2", "joint"), reference_runs["joint"])


# Kills at chosen points, in a forked child --------------------------------------------------


@pytest.mark.slow
def test_kill_while_writing_a_checkpoint(
    make_project, reference_runs: dict[str, Path], run_in_child, tmp_path: Path, monkeypatch
) -> None:
    """SIGKILL with the 4th checkpoint's optimizer file half-written: the 3rd is resumed."""
    work = make_project(tmp_path / "work", train=TRAIN)
    monkeypatch.chdir(work)

    def body() -> None:
        original, calls = ckpt.save_file, []

        def half_then_die(tensors, filename, *args, **kwargs):
            calls.append(filename)
            original(tensors, filename, *args, **kwargs)
            if len(calls) == 7:  # save_file runs twice per checkpoint: optimizer, then RNG
                data = Path(filename).read_bytes()
                Path(filename).write_bytes(data[: len(data) // 2])
                sigkill_self()

        ckpt.save_file = half_then_die
        invoke(*FINETUNE, *SAVE_EVERY_STEP)

    assert killed(run_in_child(body))
    (half_written,) = at(work).models("sst2").glob(f".tmp-{CHECKPOINT.name}-*")
    assert (half_written / ckpt.MODEL).exists() and not (half_written / ckpt.STATE).exists()
    assert checkpoint_step(work / CHECKPOINT) == 3
    # log_every changes no arithmetic, so it does not stop the resume
    output = ok(*FINETUNE, *SAVE_EVERY_STEP, "--set", "train.log_every=5")
    assert resumed_from(output).endswith("stage 1, epoch 1, batch 3 (step 3)")
    assert not half_written.exists() and not (work / CHECKPOINT).exists()
    assert_same_run(at(work).model("sst2", "joint"), reference_runs["joint"])


@pytest.mark.slow
def test_deebert_resumes_across_the_stage_boundary(
    make_project, reference_runs: dict[str, Path], run_in_child, tmp_path: Path, monkeypatch
) -> None:
    """Killed right after the checkpoint that closes stage 1: stage 2 starts from it."""
    work = make_project(tmp_path / "work", train=TRAIN)
    monkeypatch.chdir(work)
    args = ("finetune", "--task", "sst2", "--method", "deebert", *SAVE_EVERY_STEP)

    def body() -> None:
        import aclpipe.training.loop as train

        original = train.save_checkpoint

        def save_then_die(folder, model, training, *rest, **kwargs):
            original(folder, model, training, *rest, **kwargs)
            if training.position.stage == 0 and training.position.epoch == TRAIN["epochs"]:
                sigkill_self()

        train.save_checkpoint = save_then_die
        invoke(*args)

    assert killed(run_in_child(body))
    state = json.loads((checkpoint_dir(at(work).model("sst2", "deebert")) / ckpt.STATE).read_text())
    assert state["position"] == {"stage": 0, "epoch": 2, "batch": 0, "global_step": 24}
    assert [e["stage"] for e in state["history"]] == [1, 1]
    output = ok(*args)
    assert resumed_from(output, "deebert").endswith("stage 2, epoch 1, batch 0 (step 24)")
    assert "deebert stage 1/2" not in output  # stage 1 is not trained again
    assert_same_run(at(work).model("sst2", "deebert"), reference_runs["deebert"])
    history = read_run_log(at(work).model("sst2", "deebert")).history
    assert [(e["stage"], e["epoch"]) for e in history] == [(1, 1), (1, 2), (2, 1), (2, 2)]


@pytest.mark.slow
def test_kill_between_the_two_renames_of_a_checkpoint(
    make_project, reference_runs: dict[str, Path], run_in_child, tmp_path: Path, monkeypatch
) -> None:
    work = make_project(tmp_path / "work", train=TRAIN)
    monkeypatch.chdir(work)

    def body() -> None:
        replace, swaps = os.replace, []

        def die_in_the_gap(src, dst, *args, **kwargs):
            if Path(dst).name == CHECKPOINT.name and Path(src).name.startswith(".tmp-"):
                swaps.append(dst)
                if len(swaps) == 3:  # step 2's checkpoint already moved aside as .old-*
                    sigkill_self()
            return replace(src, dst, *args, **kwargs)

        os.replace = die_in_the_gap
        invoke(*FINETUNE, *SAVE_EVERY_STEP)

    assert killed(run_in_child(body))
    assert not (work / CHECKPOINT).exists()
    output = ok(*FINETUNE, *SAVE_EVERY_STEP)
    assert_same_run(at(work).model("sst2", "joint"), reference_runs["joint"])
    assert leftovers(at(work).models("sst2")) == []
    assert resumed_from(output).endswith(("(step 2)", "(step 3)"))


def _kill_after_first_checkpoint(run_in_child, *extra: str) -> None:
    def body() -> None:
        import aclpipe.training.loop as train

        original = train.save_checkpoint

        def save_then_die(*args, **kwargs):
            original(*args, **kwargs)
            sigkill_self()

        train.save_checkpoint = save_then_die
        invoke(*FINETUNE, *SAVE_EVERY_STEP, *extra)

    assert killed(run_in_child(body))


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        (ckpt.MODEL, "truncate"),
        (ckpt.OPTIMIZER, "truncate"),
        (ckpt.RNG, "delete"),
        (ckpt.STATE, "truncate"),
    ],
)
@pytest.mark.slow
def test_damaged_checkpoint_is_one_line_error(
    make_project, run_in_child, tmp_path: Path, monkeypatch, name: str, damage: str
) -> None:
    work = make_project(tmp_path / "work", train={"epochs": 1, "batch_size": 16})
    monkeypatch.chdir(work)
    _kill_after_first_checkpoint(run_in_child)
    target = work / CHECKPOINT / name
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        target.unlink()
    damaged = sorted((p.name, p.read_bytes()) for p in (work / CHECKPOINT).iterdir())
    result = invoke(*FINETUNE, *SAVE_EVERY_STEP)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: checkpoint {CHECKPOINT} is damaged (")
    assert "delete that folder" in lines[0]
    # kept as it was for inspection; no model written from it
    assert sorted((p.name, p.read_bytes()) for p in (work / CHECKPOINT).iterdir()) == damaged
    assert not at(work).model("sst2", "joint").exists()


@pytest.mark.slow
def test_checkpoint_of_other_params_is_discarded(
    make_project, reference_runs: dict[str, Path], run_in_child, tmp_path: Path, monkeypatch
) -> None:
    """A checkpoint written at another learning rate is dropped: training starts afresh and
    matches an uninterrupted run with the current params."""
    work = make_project(tmp_path / "work", train=TRAIN)
    monkeypatch.chdir(work)
    _kill_after_first_checkpoint(run_in_child, "--set", "train.lr=5e-3")
    assert checkpoint_step(work / CHECKPOINT) == 1
    output = ok(*FINETUNE)
    assert "resuming" not in output
    assert "joint stage 1/1 step 1/24" in output  # counted from the first step
    assert not (work / CHECKPOINT).exists()
    assert_same_run(at(work).model("sst2", "joint"), reference_runs["joint"])


# save_checkpoint / load_checkpoint, in process -------------------------------------------


def _train_a_little(model: torch.nn.Module, steps: int):
    optimizer = torch.optim.AdamW(
        [
            {"params": model[0].parameters(), "lr": 1e-2, "weight_decay": 0.01},
            {"params": model[1].parameters(), "lr": 1e-1, "weight_decay": 0.0},
        ]
    )
    scheduler = linear_schedule(optimizer, total_steps=10, warmup_ratio=0.2)
    for _ in range(steps):
        x = torch.randn(8, 4)  # [B, 4]
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return optimizer, scheduler


def _model() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def _draws() -> tuple:
    """One value from each RNG a training step may use."""
    return (torch.rand(5).tolist(), random.random(), np.random.rand(3).tolist())


def test_checkpoint_roundtrip_restores_everything(tmp_path: Path) -> None:
    torch.manual_seed(0)
    random.seed(1)
    np.random.seed(2)
    model = _model()
    optimizer, scheduler = _train_a_little(model, steps=3)
    rank1 = torch.Generator().manual_seed(7).get_state()  # another process's RNG state
    folder = checkpoint_dir(tmp_path / "m")
    history, step_log = [{"epoch": 1, "dev_scores": [0.5, 0.75]}], [{"step": 3, "loss": 0.25}]
    training = TrainingState(
        Position(1, 2, 3, 4),
        optimizer.state_dict(),
        scheduler.state_dict(),
        history,
        step_log,
    )
    save_checkpoint(folder, model, training, "print", [torch.get_rng_state(), rank1])
    expected_draws = _draws()
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    torch.manual_seed(99)  # scramble every RNG, start from another model
    random.seed(99)
    np.random.seed(99)
    restored = _model()
    resumed = load_checkpoint(folder, restored, "print", rank=0)
    assert resumed is not None
    assert resumed.position == Position(1, 2, 3, 4)
    assert resumed.history == history and resumed.step_log == step_log
    assert _draws() == expected_draws
    for k, v in restored.state_dict().items():
        assert torch.equal(v, weights[k]), k

    restored_optimizer, restored_scheduler = _train_a_little(restored, steps=0)
    restored_optimizer.load_state_dict(resumed.optimizer_state)
    restored_scheduler.load_state_dict(resumed.scheduler_state)
    assert restored_scheduler.state_dict() == scheduler.state_dict()
    assert restored_scheduler.get_last_lr() == scheduler.get_last_lr()
    want, got = optimizer.state_dict(), restored_optimizer.state_dict()
    assert got["param_groups"] == json.loads(json.dumps(want["param_groups"]))
    assert want["state"].keys() == got["state"].keys()
    for index, entry in want["state"].items():
        for key, value in entry.items():
            assert torch.equal(got["state"][index][key], value), (index, key)
            assert got["state"][index][key].dtype == value.dtype

    # one more identical step from both: the same bits
    x = torch.randn(8, 4)  # [B, 4]
    for m, opt, sched in (
        (model, optimizer, scheduler),
        (restored, restored_optimizer, restored_scheduler),
    ):
        m(x).pow(2).mean().backward()
        opt.step()
        sched.step()
    for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values()):
        assert torch.equal(a, b), name

    # every process gets its own torch RNG state back
    load_checkpoint(folder, _model(), "print", rank=1)
    assert torch.equal(torch.get_rng_state(), rank1)


def test_load_checkpoint_cleans_up_and_checks_the_fingerprint(tmp_path: Path) -> None:
    folder = checkpoint_dir(tmp_path / "m")
    assert load_checkpoint(folder, _model(), "print") is None  # nothing to resume
    model = _model()
    optimizer, scheduler = _train_a_little(model, steps=1)
    fresh = TrainingState(Position(), optimizer.state_dict(), scheduler.state_dict())
    save_checkpoint(folder, model, fresh, "print")
    stale = tmp_path / f".tmp-{folder.name}-killed"  # what a kill mid-write leaves
    stale.mkdir()
    (stale / ckpt.MODEL).write_bytes(b"half")
    assert load_checkpoint(folder, _model(), "print") is not None
    assert not stale.exists()
    assert load_checkpoint(folder, _model(), "other params") is None
    assert not folder.exists()  # it cannot be continued, so it is removed


def test_damaged_checkpoint_names_the_folder(tmp_path: Path) -> None:
    folder = checkpoint_dir(tmp_path / "m")
    model = _model()
    optimizer, scheduler = _train_a_little(model, steps=1)
    fresh = TrainingState(Position(), optimizer.state_dict(), scheduler.state_dict())
    save_checkpoint(folder, model, fresh, "print")
    (folder / ckpt.MODEL).write_bytes((folder / ckpt.MODEL).read_bytes()[:40])
    with pytest.raises(UserError, match=f"checkpoint {folder} is damaged"):
        load_checkpoint(folder, _model(), "print")
    assert (folder / ckpt.MODEL).exists()  # kept for inspection
