"""Typed, strict configuration read once from params.yaml.

Each section of params.yaml is a dataclass with a comment per field and its range checks
(``RANGES``, from ``aclpipe.checks``), defined beside what it configures (``data.config``,
``modeling.config``, ``training.config``, ``evaluation.config``; ``pipeline`` below). This
module only reads the YAML strictly (types, unknown keys), calls each section's checks and
assembles ``Params``; each stage takes only the sections it needs. ``methods.<name>`` fills
that method's own knobs record, which lives with the method
(``aclpipe.training.knobs.KNOBS``): a knob the method does not read is an unknown key. Unknown keys, wrong types and out-of-range values are
``UserError``s that name the key and the fix. ``--set section.key=value`` overrides use the
same dotted keys as ``dvc exp run -S``. A knob a file leaves out takes its one default, the
field's in its dataclass; ``resolved`` writes every value out (the studies' loaders and
``aclpipe params show`` use it).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aclpipe.checks import range_check
from aclpipe.data.config import DataConfig
from aclpipe.data.tasks import TASKS
from aclpipe.errors import UserError
from aclpipe.evaluation.config import EvaluateConfig
from aclpipe.layout import PARAMS
from aclpipe.modeling.config import DEFAULT_MODEL, ModelConfig
from aclpipe.training.config import TrainConfig
from aclpipe.training.knobs import KNOBS, METHOD_NAMES, check_method

# the sections, importable from here as before
__all__ = ["DEFAULT_MODEL", "DataConfig", "EvaluateConfig", "ModelConfig", "Params", "TrainConfig"]


@dataclass
class PipelineConfig:
    # tasks and methods a stage runs without --task / --method (dvc.yaml's matrix)
    tasks: list[str] = field(default_factory=lambda: ["sst2", "mrpc"])
    methods: list[str] = field(default_factory=lambda: ["ce", "joint", "deebert"])
    # trained methods that `dvc repro` exports for early exit (export-exits)
    export_methods: list[str] = field(default_factory=list)


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
        check = range_check(cls, name)  # the section's own range check, beside its defaults
        if check is not None and values[name] is not None:
            check(key, values[name])
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
    return Params(**built)


def resolved(raw: dict[str, Any], methods: Iterable[str] = ()) -> dict[str, Any]:
    """``raw`` with every value written out: each knob ``raw`` leaves out at its one default
    (its section's dataclass), and a ``methods.<name>`` section for every method ``raw`` lists
    or ``methods`` names, in the registry's order. A study's params file holds only what it
    changes; its loader fills the rest in here, so that a run's params, overrides and record
    read as if every value were written (``aclpipe params show`` prints the result)."""
    if isinstance(raw, dict) and isinstance(raw.get("methods") or {}, dict):  # else: one line below
        listed = raw.get("methods") or {}
        for name in listed:
            check_method(name, f"unknown method section methods.{name}")
        wanted = {*listed, *(check_method(name) for name in methods)}
        raw = {**raw, "methods": {n: listed.get(n) for n in METHOD_NAMES if n in wanted}}
    return dataclasses.asdict(params_from_dict(raw))


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


def load_params(path: Path | str = PARAMS, overrides: list[str] | None = None) -> Params:
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
    elif path.name == PARAMS and path.parent == Path("."):
        raw = {}
    else:
        raise UserError(f"params file {path} not found: pass an existing file with --params")
    return params_from_dict(apply_overrides(raw, overrides or []))
