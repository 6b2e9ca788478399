"""The prepare stage's knobs (params.yaml's ``data:`` section): where GLUE is read from, how
it is subsampled and truncated, and the share held out for validation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from aclpipe.checks import Check, positive
from aclpipe.errors import UserError


def _share_of_train(key: str, value: Any) -> None:
    if not 0 <= value < 1:
        raise UserError(
            f"{key} must be in [0, 1) (a share of train; 0 = no validation split), got {value!r}"
        )


@dataclass
class DataConfig:
    # local classic glue_data folder; GLUE_DIR and --glue-dir override it
    glue_dir: str | None = "../shared/glue"
    hub_id: str = "nyu-mll/glue"  # used when the local folder lacks the task
    max_length: int = 128  # tokens per example after truncation (pairs truncated longest-first)
    max_train_samples: int | None = None  # deterministic subsample of train (None: all)
    max_eval_samples: int | None = None  # deterministic subsample of each dev split (None: all)
    seed: int = 42  # seed of the subsampling and of the validation split
    # share of train held out as the validation split (stratified by label, fixed by seed),
    # on which hyper-parameters and exit thresholds are chosen; 0: no validation split
    validation_fraction: float = 0.0
    # few-shot: train on a class-stratified draw of N examples of train, made after the
    # validation split is held out (which is then not written: N examples leave nothing honest
    # to select on); ids in meta.json (aclpipe.data.fewshot). None: the whole split
    fewshot_examples: int | None = None
    # the draw's seed; a few-shot study sets it to train.seed (a draw is one seed)
    fewshot_seed: int = 1
    # how the validation split is drawn: examples (one by one, stratified by label) |
    # phrase-family (whole phrase families: data/phrase_holdout.py) for the tasks whose rows are
    # phrases (stages/prepare.py PHRASE_ROW_TASKS: SST-2); every other task keeps examples
    holdout: Literal["examples", "phrase-family"] = "examples"

    # range checks, beside the defaults (aclpipe.checks; config.py calls them per key)
    RANGES: ClassVar[dict[str, Check]] = {
        "max_length": positive,
        "max_train_samples": positive,
        "max_eval_samples": positive,
        "fewshot_examples": positive,
        "validation_fraction": _share_of_train,
    }
