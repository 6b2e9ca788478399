"""A stage killed mid-write leaves nothing that DVC or a later stage would take as complete.

Each stage runs in a forked child that sends itself SIGKILL half-way through writing its
last file (no exception, no cleanup: what ``kill -9`` or a power cut leaves). Then the
stage's final outputs must be absent, or, when a complete output was there before, still
byte-identical; anything new on disk must sit under a ``.tmp-*`` name (or be the resumable
checkpoint), and every other file must be as it was. The ONNX exporter is
replaced by a stub here (the real one takes seconds per exit; test_export.py covers it):
atomicity is about how ``export-exits`` writes, not what.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import invoke, ok, tree
from paths import RELATIVE, at

from aclpipe.layout import (
    CURVES_CSV,
    EMBEDDINGS_ONNX,
    EXIT_SCORES_PNG,
    EXPORT_JSON,
    META,
    MODEL_CONFIG,
    TOKENIZER,
    TRAINING_LOG,
    WEIGHTS,
)
from aclpipe.stages.tradeoff import NAMES


def killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def die_while_writing(name: str) -> None:
    """Patch this process so that writing a file called ``name`` ends half-way in SIGKILL.

    Covers both ways the stages write: ``Path.write_text`` inside a temporary folder (half the
    text is written, then the kill), and a finished temporary file renamed into place with
    ``os.replace`` (the temporary is cut to half, then the kill, before the rename).
    """
    write_text, replace = Path.write_text, os.replace

    def write_half_then_die(self, data, *args, **kwargs):
        if self.name == name:
            write_text(self, data[: len(data) // 2], *args, **kwargs)
            sigkill_self()
        return write_text(self, data, *args, **kwargs)

    def cut_then_die(src, dst, *args, **kwargs):
        if Path(dst).name == name and Path(src).is_file():
            Path(src).write_bytes(Path(src).read_bytes()[: Path(src).stat().st_size // 2])
            sigkill_self()
        return replace(src, dst, *args, **kwargs)

    Path.write_text = write_half_then_die
    os.replace = cut_then_die


def fake_onnx_export(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-ins for the ONNX segment export with its onnxruntime parity run, and the opset
    reader: stub graph files, what ``write_segments`` records."""
    import aclpipe.exits.export as export

    def write_segments(model, names, batches, folder, what, opset=None) -> dict:
        stub = lambda name: (folder / name).write_bytes(f"stub {name} {time.time_ns()}".encode())  # noqa: E731
        stub(EMBEDDINGS_ONNX)
        segments, start = [], 0
        for layer in model.spec.exits:
            stub(f"segment_{layer}.onnx")
            segments.append({"file": f"segment_{layer}.onnx", "layers": [start + 1, layer],
                             "exit": layer, "max_abs_diff_states": 0.0,
                             "max_abs_diff_logits": 0.0, "chain_max_abs_diff_logits": 0.0})  # fmt: skip
            start = layer
        embeddings = {"file": EMBEDDINGS_ONNX, "inputs": names, "max_abs_diff_states": 0.0}
        return {"embeddings": embeddings, "segments": segments, "states": "last", "tolerance": 1e-4}

    monkeypatch.setattr(export, "write_segments", write_segments)
    monkeypatch.setattr(export, "graph_opset", lambda path: 18)


def files_under(root: Path, outputs: tuple[str, ...]) -> dict[str, str | None]:
    """The files of the stage's outputs (temporaries, ``.tmp-*``, are not outputs)."""
    found = {}
    for out in outputs:
        path = root / out
        if path.is_file():
            found[out] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            found.update({f"{out}/{k}": v for k, v in tree(path).items() if v is not None})
    return {k: v for k, v in found.items() if not any(s.startswith(".tmp-") for s in k.split("/"))}


def changes_elsewhere(before: dict, after: dict, outputs: tuple[str, ...]) -> list[str]:
    """Files added, changed or removed outside the stage's outputs, its temporaries
    (``.tmp-*``) and a resumable checkpoint (``.<method>.checkpoint``)."""

    def elsewhere(path: str) -> bool:
        parts = Path(path).parts
        owned = any(path == out or path.startswith(f"{out}/") for out in outputs)
        return not owned and not any(
            p.startswith(".tmp-") or p.endswith(".checkpoint") for p in parts
        )

    files = {p for p, digest in {**before, **after}.items() if digest is not None}
    return sorted(p for p in files if elsewhere(p) and before.get(p) != after.get(p))


@dataclass(frozen=True)
class StageRun:
    name: str
    args: tuple[str, ...]
    changed: tuple[str, ...]  # arguments under which a rerun writes other bytes
    dies_in: str  # the file being written when the kill comes: the stage's last, or near it
    outputs: tuple[str, ...]  # what the stage owns, relative to the project


STAGES = [
    StageRun(
        "prepare",
        ("prepare", "--task", "sst2"),
        ("--set", "data.max_train_samples=10"),
        META,
        (RELATIVE.data("sst2").as_posix(),),
    ),
    StageRun(
        "finetune",
        ("finetune", "--task", "sst2", "--method", "joint"),
        ("--set", "train.seed=1"),
        MODEL_CONFIG,
        tuple(
            (RELATIVE.model("sst2", "joint") / n).as_posix()
            for n in (
                WEIGHTS,
                MODEL_CONFIG,
                TOKENIZER,
                TRAINING_LOG,
            )
        ),
    ),
    StageRun(
        "evaluate",
        ("evaluate", "--task", "sst2", "--method", "joint"),
        ("--set", "evaluate.grid_points=3"),
        CURVES_CSV,
        (RELATIVE.report("sst2", "joint").as_posix(),),
    ),
    StageRun(
        "export-exits",
        ("export-exits", "--task", "sst2", "--method", "joint"),
        (),  # the stub graphs differ from run to run
        EXPORT_JSON,
        (RELATIVE.export("sst2", "joint").as_posix(),),
    ),
    StageRun(
        "tradeoff",
        ("tradeoff", "--task", "sst2"),
        ("--method", "ce"),
        EXIT_SCORES_PNG,
        tuple((RELATIVE.reports("sst2") / n).as_posix() for n in NAMES),
    ),
]
_XFAIL: dict = {}
STAGE_PARAMS = [pytest.param(s, id=s.name, marks=_XFAIL.get(s.name, ())) for s in STAGES]


@pytest.fixture(scope="module")
def complete(tmp_path_factory: pytest.TempPathFactory, make_project) -> Path:
    """A project where every stage has run once: data, joint and ce trained and evaluated,
    joint exported (stub graphs), the trade-off report written."""
    work = make_project(tmp_path_factory.mktemp("complete"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        fake_onnx_export(mp)
        for method in ("joint", "ce"):
            ok("finetune", "--task", "sst2", "--method", method)
            ok("evaluate", "--task", "sst2", "--method", method)
        ok("export-exits", "--task", "sst2", "--method", "joint")
        ok("tradeoff", "--task", "sst2")
    return work


@pytest.fixture
def work(complete: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of ``complete`` as the current directory, the stub exporter in place."""
    folder = tmp_path / "work"
    shutil.copytree(complete, folder, symlinks=True)
    monkeypatch.chdir(folder)
    monkeypatch.delenv("GLUE_DIR", raising=False)
    fake_onnx_export(monkeypatch)
    return folder


def kill_mid_write(run_in_child, stage: StageRun, *extra: str) -> None:
    def body() -> None:
        die_while_writing(stage.dies_in)
        invoke(*stage.args, *extra)

    assert killed(run_in_child(body)), f"{stage.name} never wrote {stage.dies_in}"


@pytest.mark.parametrize("stage", STAGE_PARAMS)
@pytest.mark.slow
def test_killed_first_run_leaves_no_output(stage: StageRun, work: Path, run_in_child) -> None:
    for out in stage.outputs:
        path = work / out
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    before = tree(work)
    kill_mid_write(run_in_child, stage)
    # nothing at a final path (an empty folder holds nothing a reader takes as output)
    assert files_under(work, stage.outputs) == {}
    assert changes_elsewhere(before, tree(work), stage.outputs) == []


@pytest.mark.parametrize("stage", STAGE_PARAMS)
@pytest.mark.slow
def test_killed_rerun_keeps_the_previous_output(stage: StageRun, work: Path, run_in_child) -> None:
    previous = files_under(work, stage.outputs)
    assert previous, f"{stage.name} has no complete output to keep"
    before = tree(work)
    kill_mid_write(run_in_child, stage, *stage.changed)
    assert files_under(work, stage.outputs) == previous
    assert changes_elsewhere(before, tree(work), stage.outputs) == []


@pytest.mark.slow
def test_killed_while_publishing_a_model_is_not_taken_as_trained(
    work: Path, complete: Path, run_in_child
) -> None:
    """Killed between the renames that move a new model into place: the file readers check for
    (aclpipe_model.json) is gone, so evaluate refuses the folder; a rerun finishes from the
    last checkpoint and publishes the same model an unbroken run does."""
    model_dir = at(work).model("sst2", "joint")

    def body() -> None:
        replace, moved = os.replace, []

        def die_on_second_move(src, dst, *args, **kwargs):
            if Path(dst).parent.resolve() == model_dir.resolve():
                moved.append(dst)
                if len(moved) == 2:
                    sigkill_self()
            return replace(src, dst, *args, **kwargs)

        os.replace = die_on_second_move
        invoke("finetune", "--task", "sst2", "--method", "joint", "--set", "train.seed=1")

    assert killed(run_in_child(body))
    assert not (model_dir / MODEL_CONFIG).exists()
    result = invoke("evaluate", "--task", "sst2", "--method", "joint")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: no trained model in models/sst2/joint")
    output = ok("finetune", "--task", "sst2", "--method", "joint", "--set", "train.seed=1")
    assert "resuming joint on sst2" in output  # the checkpoint outlives a failed publish
    ok("finetune", "--task", "sst2", "--method", "joint")  # back to the complete run's params
    names = (WEIGHTS, MODEL_CONFIG)
    for name in names:
        assert (model_dir / name).read_bytes() == (
            at(complete).model("sst2", "joint") / name
        ).read_bytes()
    assert tree(model_dir / TRAINING_LOG) == tree(at(complete).model("sst2", "joint") / TRAINING_LOG)
