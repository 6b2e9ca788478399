"""The prepare stage's knobs (params.yaml's ``data:`` section): where GLUE is read from, how
it is subsampled and truncated, and the share held out for validation."""

from __future__ import annotations

from dataclasses import dataclass


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
