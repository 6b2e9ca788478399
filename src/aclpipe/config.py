"""Typed, strict configuration read once from params.yaml.

Each section of params.yaml is a dataclass below, with a comment per field; each stage takes
only the sections it needs. ``methods.<name>`` fills that method's own knobs record, which
lives with the method (``aclpipe.training.knobs.KNOBS``): a knob the method does not read
is an unknown key. Unknown keys, wrong types and out-of-range values are
``UserError``s that name the key and the fix. ``--set section.key=value`` overrides use the
same dotted keys as ``dvc exp run -S``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from aclpipe.data.tasks import TASKS
from aclpipe.errors import UserError
from aclpipe.training.knobs import KNOBS, check_method

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass
class PipelineConfig:
    # tasks and methods a stage runs without --task / --method (dvc.yaml's matrix)
    tasks: list[str] = field(default_factory=lambda: ["sst2", "mrpc"])
    methods: list[str] = field(default_factory=lambda: ["ce", "joint", "deebert"])
    # trained methods that `dvc repro` exports for early exit (export-exits)
    export_methods: list[str] = field(default_factory=list)


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
    # how the validation split is drawn: examples (one by one, stratified by label) |
    # phrase-family (whole phrase families, for phrase rows such as SST-2's: data/phrase_holdout.py)
    holdout: Literal["examples", "phrase-family"] = "examples"


@dataclass
class ModelConfig:
    name: str = DEFAULT_MODEL  # hub id or local folder; the default resolves offline from a package
    # cls | mean | layer-attention | auto (mean for sentence-transformers checkpoints, else cls)
    pooling: str = "auto"
    exits: list[int] | None = None  # 1-based layers with an exit head (None: every layer)
    dropout: float | None = None  # exit-head dropout (None: the backbone's hidden_dropout_prob)
    label_embedding: str = "classifier"  # classifier (rows of W_k) | separate (own [C, d] table)
    trust_remote_code: bool = False  # allow a hub model's own Python code to run


@dataclass
class TrainConfig:
    epochs: int = 3  # epochs per stage
    batch_size: int = 32  # per process
    # batches of rows of similar length (less padding; HF Trainer's group_by_length), in a
    # shuffled order, longest first (aclpipe.training.batch_order); false: a plain shuffle.
    # ~2x faster on SST-2, same dev score for ce, but acl-cl's inner exits lost 1-2.6 points
    # (README, Benchmarks): off unless asked for
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


@dataclass
class EvaluateConfig:
    batch_size: int = 64  # all-exit forward passes over the dev split
    sweep: bool = True  # multi-exit models: sweep every exit policy over a threshold grid
    grid_points: int = 11  # thresholds per policy for entropy and confidence (patience: 1..E-1)
    patience_eps: float = 0.1  # patience on regression (STS-B): outputs agree when |diff| < eps
    timing_examples: int = 128  # dev examples the speed-ups are measured on (0: no timing)
    timing_repeats: int = 3  # timed repeats after a warm-up; the median is reported
    # engines the speed-ups are timed on: torch (PyTorch eager) and onnx (ONNX Runtime on the
    # segments, exported for the sweep into a temporary folder; needs onnxruntime)
    engines: list[Literal["torch", "onnx"]] = field(default_factory=lambda: ["torch", "onnx"])


@dataclass
class Params:
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    # method name -> its knobs record (KNOBS[name]), for the methods params.yaml lists
    methods: dict[str, Any] = field(default_factory=dict)

    def method(self, name: str) -> Any:
        """The knobs record of one method: its params.yaml section over the method's defaults."""
        if name in self.methods:
            return self.methods[name]
        return KNOBS[check_method(name)]()


_CHOICES = {
    "model.pooling": ("auto", "cls", "mean", "layer-attention"),
    "model.label_embedding": ("classifier", "separate"),
    "train.device": ("auto", "cpu", "cuda"),
}  # a knob typed Literal[...] (grad_scope, weights) takes its choices from its type
_POSITIVE = {
    "data.max_length",
    "data.max_train_samples",
    "data.max_eval_samples",
    "train.epochs",
    "train.batch_size",
    "train.lr",
    "train.head_lr",
    "train.log_every",
    "evaluate.batch_size",
    "evaluate.grid_points",
    "evaluate.timing_repeats",
    "evaluate.patience_eps",
    "methods.*.tau",
    "methods.*.T",
}
_NON_NEGATIVE = {
    "train.weight_decay",
    "train.max_grad_norm",
    "methods.*.lam",
    "methods.*.lam_cl",
    "evaluate.timing_examples",
    "train.save_every",
}
_UNIT = {"train.warmup_ratio", "methods.*.gamma", "model.dropout"}


def _check_value(key: str, value: Any, hint: type | Any) -> Any:
    """Check ``value`` against the annotation ``hint``; return it (ints widened to float)."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            shown = ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)
            raise UserError(f"{key} is {value!r}: use one of {shown}")  # bools as YAML writes them
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check_value(key, value, inner)
    if origin is list:
        (inner,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise UserError(f"{key} must be a list, got {value!r}: write it as [a, b, ...]")
        return [_check_value(f"{key}[{i}]", v, inner) for i, v in enumerate(value)]
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if hint is float and isinstance(value, str):  # YAML reads 2e-5 as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise UserError(
            f"{key} must be {hint.__name__}, got {value!r} ({type(value).__name__}): fix it in "
            "params.yaml or --set"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{key} must be a finite number, got {value!r}")
    return value


def _check_range(key: str, value: Any) -> None:
    pattern = key if not key.startswith("methods.") else "methods.*." + key.split(".")[-1]
    if value is None:
        return
    if pattern in _CHOICES and value not in _CHOICES[pattern]:
        raise UserError(f"{key} is {value!r}: use one of {', '.join(_CHOICES[pattern])}")
    if pattern in _POSITIVE and value <= 0:
        raise UserError(f"{key} must be > 0, got {value!r}: fix it in params.yaml or --set")
    if pattern in _NON_NEGATIVE and value < 0:
        raise UserError(f"{key} must be >= 0, got {value!r}: fix it in params.yaml or --set")
    if pattern in _UNIT and not 0 <= value <= 1:
        raise UserError(f"{key} must be in [0, 1], got {value!r}: fix it in params.yaml or --set")
    if key == "data.validation_fraction" and not 0 <= value < 1:
        raise UserError(
            f"{key} must be in [0, 1) (a share of train; 0 = no validation split), got {value!r}"
        )
    if key == "evaluate.engines" and (not value or len(set(value)) < len(value)):
        raise UserError(
            f"{key} is {value!r}: list torch, onnx or both, each once (evaluate.timing_examples: "
            "0 turns timing off)"
        )
    if key == "evaluate.grid_points" and value < 2:
        raise UserError(f"{key} must be >= 2 (a grid has two ends), got {value!r}")
    if pattern == "methods.*.max_angle" and not 0 <= value <= 180:
        raise UserError(f"{key} must be in [0, 180] degrees, got {value!r}")


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"{prefix} must be a mapping of keys to values, got {raw!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown and not known:
        raise UserError(
            f"unknown key {prefix}.{unknown[0]}: {prefix} takes no keys (leave it {{}})"
        )
    if unknown:
        raise UserError(
            f"unknown key {prefix}.{unknown[0]}: valid keys of {prefix} are {', '.join(sorted(known))}"
        )
    values = {}
    for name, value in raw.items():
        key = f"{prefix}.{name}"
        values[name] = _check_value(key, value, hints[name])
        _check_range(key, values[name])
    return cls(**values)


def params_from_dict(raw: dict[str, Any]) -> Params:
    """Build typed ``Params`` from a params.yaml mapping; every error is a ``UserError``."""
    if not isinstance(raw, dict):
        raise UserError("params file must be a YAML mapping of sections (pipeline, data, ...)")
    sections = {f.name for f in dataclasses.fields(Params)}
    unknown = sorted(set(raw) - sections)
    if unknown:
        raise UserError(
            f"unknown section {unknown[0]!r} in params: valid sections are {', '.join(sorted(sections))}"
        )
    hints = typing.get_type_hints(Params)
    built: dict[str, Any] = {}
    for name in sections - {"methods"}:
        built[name] = _build(hints[name], raw.get(name), name)
    methods_raw = raw.get("methods") or {}
    if not isinstance(methods_raw, dict):
        raise UserError("methods must be a mapping of method name to its knobs")
    pipeline = built["pipeline"]
    for name in pipeline.tasks:
        if name not in TASKS:
            raise UserError(f"pipeline.tasks has unknown {name!r}: use {', '.join(TASKS)}")
    for key in ("methods", "export_methods"):
        for name in getattr(pipeline, key):
            check_method(name, f"pipeline.{key} has unknown {name!r}")
    built["methods"] = {}
    for method, knobs in methods_raw.items():
        check_method(method, f"unknown method section methods.{method}")
        if knobs is not None and not isinstance(knobs, dict):
            raise UserError(f"methods.{method} must be a mapping of knobs, got {knobs!r}")
        built["methods"][method] = _build(KNOBS[method], knobs, f"methods.{method}")
    if built["model"].exits is not None and not built["model"].exits:
        raise UserError("model.exits is empty: list 1-based layers, or null for every layer")
    return Params(**built)


def _parse_value(text: str) -> Any:
    """A ``--set`` value as YAML, with ``1e-3`` read as a number (YAML 1.1 reads a string)."""
    if not text.strip():
        return None
    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value) if "." in value or "e" in value.lower() else value
        except ValueError:
            return value
    return value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides (values parsed as YAML) to a raw mapping."""
    for item in overrides:
        if "=" not in item:
            raise UserError(f"--set {item!r} is not key=value: write e.g. --set train.lr=3e-5")
        dotted, text = item.split("=", 1)
        keys = dotted.strip().split(".")
        if len(keys) < 2 or not all(keys):
            raise UserError(f"--set {dotted!r}: use a dotted key such as train.lr")
        node = raw
        for k in keys[:-1]:
            if node.get(k) is None:  # a missing or empty section (`train:` reads as None)
                node[k] = {}
            node = node[k]
            if not isinstance(node, dict):
                raise UserError(f"--set {dotted!r}: {k} is not a section")
        node[keys[-1]] = _parse_value(text)
    return raw


def load_params(path: Path | str = "params.yaml", overrides: list[str] | None = None) -> Params:
    """Read params.yaml (missing file: defaults only if no file was named) plus overrides."""
    path = Path(path)
    if path.exists():
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            line = getattr(getattr(err, "problem_mark", None), "line", None)
            where = f" at line {line + 1}" if line is not None else ""
            raise UserError(f"{path} is not valid YAML{where}: fix the syntax") from None
        except UnicodeDecodeError:
            raise UserError(f"{path} is not UTF-8 text: save it as UTF-8") from None
    elif path.name == "params.yaml" and path.parent == Path("."):
        raw = {}
    else:
        raise UserError(f"params file {path} not found: pass an existing file with --params")
    return params_from_dict(apply_overrides(raw, overrides or []))
