"""Resumable training state: written atomically, read back exactly, never executed.

A checkpoint folder holds the model (``model.safetensors``), the optimizer's tensors
(``optimizer.safetensors``), the torch RNG states (``rng.safetensors``) and everything else as
JSON (``state.json``: position in the data, scheduler, optimizer hyper-parameters, Python and
NumPy RNG states, history, step log, and a fingerprint of the params that produced it). No
pickle: a checkpoint is data only. The folder is replaced whole (``atomic_dir``), so a kill at
any moment leaves either the previous complete checkpoint or the new one.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from aclpipe import atomic
from aclpipe.errors import UserError
from aclpipe.layout import CHECKPOINT_OPTIMIZER, CHECKPOINT_RNG, CHECKPOINT_STATE, WEIGHTS

STATE = CHECKPOINT_STATE
MODEL = WEIGHTS
OPTIMIZER = CHECKPOINT_OPTIMIZER
RNG = CHECKPOINT_RNG


@dataclass
class Position:
    """Where training stands: stage and epoch (0-based), batches done in that epoch."""

    stage: int = 0
    epoch: int = 0
    batch: int = 0
    global_step: int = 0


@dataclass
class TrainingState:
    """What a checkpoint holds besides the weights and the RNGs: what ``save_checkpoint``
    writes and ``load_checkpoint`` gives back."""

    position: Position  # where the next batch starts
    optimizer_state: dict | None = None  # the stage's optimizer (None: the stage starts afresh)
    scheduler_state: dict | None = None  # and its schedule
    history: list = field(default_factory=list)  # dev scores after each epoch
    step_log: list = field(default_factory=list)  # one dict per optimiser step


def fingerprint(record: dict) -> str:
    """A stable hash of what a run depends on (params, data, world size)."""
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def _rng_state(torch_per_rank: list[torch.Tensor] | None) -> tuple[dict, dict]:
    tensors = {"torch": torch.get_rng_state()}
    for rank, state in enumerate(torch_per_rank or []):  # dropout differs per process
        tensors[f"torch.rank{rank}"] = state
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = state
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    plain = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), pos, has_gauss, cached],
    }
    return tensors, plain


def _set_rng_state(tensors: dict, plain: dict, rank: int) -> None:
    torch.set_rng_state(tensors.get(f"torch.rank{rank}", tensors["torch"]))
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda."))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, internal, gauss = plain["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = plain["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def _split_optimizer(state: dict) -> tuple[dict, dict]:
    """Optimizer state_dict -> (tensors for safetensors, the rest as JSON)."""
    tensors, plain = {}, {"param_groups": state["param_groups"], "state": {}}
    for index, entry in state["state"].items():
        plain["state"][str(index)] = {}
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{key}"] = value.contiguous()
            else:
                plain["state"][str(index)][key] = value
    return tensors, plain


def _join_optimizer(tensors: dict, plain: dict) -> dict:
    state = {int(i): dict(entry) for i, entry in plain["state"].items()}
    for name, value in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": plain["param_groups"]}


def save_checkpoint(
    folder: Path,
    model: torch.nn.Module,
    training: TrainingState,
    print_: str,
    torch_rng_per_rank: list[torch.Tensor] | None = None,
) -> None:
    """Write the whole training state into ``folder`` atomically; ``print_`` is the fingerprint.

    ``training`` holds the optimizer's and scheduler's ``state_dict()`` (the scheduler's is
    plain numbers: ``lr_lambdas`` is None for functions). ``torch_rng_per_rank`` holds every
    process's torch RNG state under multi-process training.
    """
    rng_tensors, rng_plain = _rng_state(torch_rng_per_rank)
    optimizer_tensors, optimizer_plain = _split_optimizer(training.optimizer_state)
    state = {
        "fingerprint": print_,
        "position": training.position.__dict__,
        "rng": rng_plain,
        "optimizer": optimizer_plain,
        "scheduler": training.scheduler_state,
        "history": training.history,
        "step_log": training.step_log,
    }
    with atomic.atomic_dir(folder) as tmp:
        save_model(model, str(tmp / MODEL))
        save_file(optimizer_tensors, str(tmp / OPTIMIZER))
        save_file(rng_tensors, str(tmp / RNG))
        (tmp / STATE).write_text(json.dumps(state), encoding="utf-8")  # written last


def _recover(folder: Path) -> None:
    """Tidy up after a kill during ``atomic_dir``'s swap: if the folder is gone, the newest
    complete copy is a ``.tmp-*`` holding state.json (written last), else the ``.old-*``."""
    temps = sorted(folder.parent.glob(f".tmp-{folder.name}-*"), key=lambda p: p.stat().st_mtime)
    olds = list(folder.parent.glob(f".old-{folder.name}-*"))
    if not folder.exists():
        complete = [p for p in temps if (p / STATE).exists()] or [
            p for p in olds if (p / STATE).exists()
        ]
        if complete:
            complete[-1].replace(folder)
    for stale in temps + olds:  # half-written copies, or the copy just superseded
        shutil.rmtree(stale, ignore_errors=True)


def load_checkpoint(
    folder: Path, model: torch.nn.Module, print_: str, rank: int = 0
) -> TrainingState | None:
    """Restore ``model`` and the RNGs from ``folder``; None when there is nothing to resume.

    A checkpoint written under other params is removed (it cannot be continued). A damaged
    one is a ``UserError`` naming the folder: it is kept for inspection, never trusted.
    """
    _recover(folder)
    if not (folder / STATE).exists():
        return None
    try:
        state = json.loads((folder / STATE).read_text(encoding="utf-8"))
        if state.get("fingerprint") != print_:
            shutil.rmtree(folder, ignore_errors=True)
            return None
        load_model(model, str(folder / MODEL))
        optimizer_state = _join_optimizer(load_file(str(folder / OPTIMIZER)), state["optimizer"])
        _set_rng_state(load_file(str(folder / RNG)), state["rng"], rank)
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(
            f"checkpoint {folder} is damaged ({type(err).__name__}): delete that folder to "
            "train from the start"
        ) from err
    return TrainingState(
        Position(**state["position"]),
        optimizer_state,
        state["scheduler"],
        state["history"],
        state["step_log"],
    )
