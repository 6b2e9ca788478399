"""The model's knobs (params.yaml's ``model:`` section): which encoder, its pooling, exits,
exit-head dropout and label embeddings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from aclpipe.checks import Check, one_of, unit
from aclpipe.errors import UserError

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def _some_layers(key: str, exits: Any) -> None:
    if not exits:
        raise UserError("model.exits is empty: list 1-based layers, or null for every layer")


@dataclass
class ModelConfig:
    name: str = DEFAULT_MODEL  # hub id or local folder; the default resolves offline from a package
    # cls | mean | layer-attention | auto (mean for sentence-transformers checkpoints, else cls)
    pooling: str = "auto"
    exits: list[int] | None = None  # 1-based layers with an exit head (None: every layer)
    dropout: float | None = None  # exit-head dropout (None: the backbone's hidden_dropout_prob)
    label_embedding: str = "classifier"  # classifier (rows of W_k) | separate (own [C, d] table)
    trust_remote_code: bool = False  # allow a hub model's own Python code to run

    # range checks, beside the defaults (aclpipe.checks; config.py calls them per key)
    RANGES: ClassVar[dict[str, Check]] = {
        "pooling": one_of("auto", "cls", "mean", "layer-attention"),
        "label_embedding": one_of("classifier", "separate"),
        "dropout": unit,
        "exits": _some_layers,
    }
