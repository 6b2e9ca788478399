"""The training loop's knobs (params.yaml's ``train:`` section). A method's own knobs are in
``aclpipe.training.knobs``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from aclpipe.checks import Check, non_negative, one_of, positive, unit


@dataclass
class TrainConfig:
    epochs: int = 3  # epochs per stage
    batch_size: int = 32  # per process
    # batches of rows of similar length (less padding; HF Trainer's group_by_length), in a
    # shuffled order, longest first (aclpipe.training.batch_order); false: a plain shuffle.
    # padding-free, 1.16-1.20x faster on SST-2, 3 seeds show no change beyond their spread
    # (docs/benchmarks.md; padded, it once cost acl-cl's inner exits 1-2.6 points): off
    # unless asked for
    group_by_length: bool = False
    # run the encoder's linear layers on real tokens only, padding skipped (the same function,
    # draw for draw; aclpipe.modeling.padding_free): auto = where the family supports it
    # (BERT, MiniLM, RoBERTa, ELECTRA), true = required (an error elsewhere), false = padded
    padding_free: Literal["auto", True, False] = "auto"
    lr: float = 2e-5  # encoder learning rate
    head_lr: float = 1e-3  # learning rate of newly initialised parts (exit heads, poolers)
    weight_decay: float = 0.01  # AdamW, not on bias and LayerNorm
    warmup_ratio: float = 0.1  # linear warm-up share of each stage's steps, then linear decay
    max_grad_norm: float = 1.0  # gradient clipping (0: off)
    seed: int = 42
    device: str = "auto"  # auto | cpu | cuda
    log_every: int = 10  # steps between progress lines when stdout is not a terminal
    save_every: int = 0  # steps between resumable checkpoints (0: at each epoch's end only)
    # also record gradient cosines for plain-sum methods (costs a second backward pass)
    record_angles: bool = False
    # score dev into the training log and write a resumable checkpoint at each epoch's end;
    # false: neither (few-shot runs of many one-batch epochs, where both would dominate the
    # run; evaluate scores dev once, at the end)
    score_each_epoch: bool = True

    # range checks, beside the defaults (aclpipe.checks; config.py calls them per key)
    RANGES: ClassVar[dict[str, Check]] = {
        "epochs": positive,
        "batch_size": positive,
        "lr": positive,
        "head_lr": positive,
        "log_every": positive,
        "weight_decay": non_negative,
        "max_grad_norm": non_negative,
        "save_every": non_negative,
        "warmup_ratio": unit,
        "device": one_of("auto", "cpu", "cuda"),
    }
