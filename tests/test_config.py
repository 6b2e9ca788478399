"""Strict, typed configuration: every bad value is a one-line UserError naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from aclpipe.config import (
    DEFAULT_MODEL,
    Params,
    apply_overrides,
    load_params,
    params_from_dict,
)
from aclpipe.errors import UserError
from aclpipe.layout import CAMPAIGN_PARAMS, PARAMS
from aclpipe.training.methods import (
    METHODS,
    AclClKnobs,
    AclKnobs,
    CosinePairsKnobs,
    DeebertSdKnobs,
    JointKnobs,
    NoKnobs,
    RomebertKnobs,
    SclKnobs,
    SimcseSupKnobs,
    SimcseUnsupKnobs,
    build_method,
)

REPO = Path(__file__).resolve().parents[1]


def user_error(raw: Any) -> str:
    with pytest.raises(UserError) as exc:
        params_from_dict(raw)
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_empty_mapping_gives_defaults() -> None:
    params = params_from_dict({})
    assert params == Params()
    assert params.model.name == DEFAULT_MODEL
    assert params.train.lr == 2e-5 and params.train.batch_size == 32


def test_sections_built_from_values() -> None:
    params = params_from_dict({
        "train": {"lr": "3e-5", "epochs": 2, "max_grad_norm": 0},
        "model": {"exits": [2, 1], "dropout": None, "pooling": "mean"},
        "data": {"max_train_samples": 100, "glue_dir": None},
    })  # fmt: skip
    assert params.train.lr == pytest.approx(3e-5)  # YAML reads 3e-5 as a string
    assert isinstance(params.train.max_grad_norm, float)  # ints widen to float
    assert params.model.exits == [2, 1] and params.model.pooling == "mean"
    assert params.data.max_train_samples == 100 and params.data.glue_dir is None


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"trainer": {}}, ["trainer", "valid sections"]),
        ({"train": {"learning_rate": 1e-5}}, ["train.learning_rate", "lr"]),
        ({"model": {"nmae": "x"}}, ["model.nmae"]),
        ({"methods": {"acl": {"temperature": 0.1}}}, ["methods.acl.temperature", "tau"]),
    ],
)
def test_unknown_section_or_key(raw: dict, names: list[str]) -> None:
    message = user_error(raw)
    assert all(name in message for name in names), message


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"train": {"batch_size": "32"}}, "train.batch_size"),
        ({"train": {"batch_size": 3.5}}, "train.batch_size"),
        ({"train": {"epochs": True}}, "train.epochs"),
        ({"train": {"lr": "fast"}}, "train.lr"),
        ({"train": {"lr": float("nan")}}, "train.lr"),
        ({"methods": {"acl": {"acl_grad": "yes"}}}, "methods.acl.acl_grad"),
        ({"model": {"exits": 3}}, "model.exits"),
        ({"model": {"exits": [1, "two"]}}, "model.exits[1]"),
        ({"pipeline": {"tasks": "sst2"}}, "pipeline.tasks"),
        ({"data": {"glue_dir": 5}}, "data.glue_dir"),
        ({"train": "fast"}, "train"),
        ({"methods": {"acl": 0.5}}, "methods.acl"),
        ({"methods": ["acl"]}, "methods"),
    ],
)
def test_wrong_type(raw: dict, key: str) -> None:
    assert key in user_error(raw)


def test_params_not_a_mapping() -> None:
    user_error(["train"])


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"train": {"lr": -1e-5}}, "train.lr"),
        ({"train": {"lr": 0}}, "train.lr"),
        ({"train": {"batch_size": 0}}, "train.batch_size"),
        ({"train": {"warmup_ratio": 2}}, "train.warmup_ratio"),
        ({"train": {"weight_decay": -0.1}}, "train.weight_decay"),
        ({"data": {"max_length": 0}}, "data.max_length"),
        ({"model": {"dropout": 1.5}}, "model.dropout"),
        ({"model": {"pooling": "max"}}, "model.pooling"),
        ({"model": {"exits": []}}, "model.exits"),
        ({"train": {"device": "tpu"}}, "train.device"),
        ({"methods": {"acl": {"max_angle": 200}}}, "methods.acl.max_angle"),
        ({"methods": {"acl": {"max_angle": -1}}}, "methods.acl.max_angle"),
        ({"methods": {"acl": {"grad_scope": "decoder"}}}, "methods.acl.grad_scope"),
        ({"methods": {"joint": {"weights": "square"}}}, "methods.joint.weights"),
        ({"methods": {"scl": {"tau": 0}}}, "methods.scl.tau"),
        ({"methods": {"romebert": {"gamma": 1.1}}}, "methods.romebert.gamma"),
        ({"evaluate": {"engines": ["tensorrt"]}}, "evaluate.engines[0]"),
        ({"evaluate": {"engines": []}}, "evaluate.engines"),
        ({"evaluate": {"engines": ["onnx", "onnx"]}}, "evaluate.engines"),
        ({"evaluate": {"engines": "onnx"}}, "evaluate.engines"),
    ],
)
def test_out_of_range(raw: dict, key: str) -> None:
    assert key in user_error(raw)


def test_evaluate_engines() -> None:
    """Both engines by default (params.yaml says so too); either alone; a bad name: one line."""
    assert params_from_dict({}).evaluate.engines == ["torch", "onnx"]
    assert load_params(REPO / PARAMS).evaluate.engines == ["torch", "onnx"]
    assert params_from_dict({"evaluate": {"engines": ["torch"]}}).evaluate.engines == ["torch"]
    assert params_from_dict({"evaluate": {"engines": ["onnx"]}}).evaluate.engines == ["onnx"]
    assert user_error({"evaluate": {"engines": ["tensorrt"]}}) == (
        "evaluate.engines[0] is 'tensorrt': use one of torch, onnx"
    )


def test_choice_error_lists_the_choices() -> None:
    message = user_error({"methods": {"acl": {"grad_scope": "decoder"}}})
    assert all(c in message for c in ("encoder", "encoder-weights", "all"))
    message = user_error({"model": {"pooling": "max"}})
    assert all(c in message for c in ("cls", "mean", "layer-attention"))


def test_boundaries_accepted() -> None:
    params = params_from_dict({
        "train": {"warmup_ratio": 0, "max_grad_norm": 0, "weight_decay": 0},
        "methods": {"acl": {"max_angle": 180, "lam": 0}, "acl-cl": {"max_angle": 0}},
    })  # fmt: skip
    assert params.method("acl").max_angle == 180.0
    assert params.method("acl-cl").max_angle == 0.0


def test_unknown_method_section() -> None:
    assert "acl_cl" in user_error({"methods": {"acl_cl": {"tau": 0.2}}})


# --set overrides -------------------------------------------------------------------------


def test_apply_overrides_parses_yaml_values() -> None:
    raw = apply_overrides({"train": {"lr": 1e-5}}, [
        "train.lr=3e-5",
        "train.batch_size=8",
        "model.exits=[1, 3]",
        "model.dropout=null",
        "methods.acl.acl_grad=false",
        "pipeline.tasks=[sst2]",
        "data.glue_dir=",
        "model.name=a=b",
    ])  # fmt: skip
    assert raw["train"] == {"lr": 3e-5, "batch_size": 8}  # 3e-5 (a YAML 1.1 string) is a number
    params = params_from_dict({k: v for k, v in raw.items() if k != "model"})
    assert params.train.lr == pytest.approx(3e-5)
    assert raw["model"] == {"exits": [1, 3], "dropout": None, "name": "a=b"}
    assert raw["methods"] == {"acl": {"acl_grad": False}}
    assert raw["pipeline"] == {"tasks": ["sst2"]}
    assert raw["data"] == {"glue_dir": None}


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ("train.lr", "key=value"),
        ("lr=1e-5", "dotted key"),
        ("train..lr=1", "dotted key"),
        ("train.lr.value=1", "not a section"),
    ],
)
def test_bad_override(item: str, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        apply_overrides({"train": {"lr": 1e-5}}, [item])


def test_override_checked_like_the_file(tmp_path: Path) -> None:
    path = tmp_path / PARAMS
    path.write_text("train:\n  lr: 2.0e-5\n", encoding="utf-8")
    assert load_params(path, ["train.epochs=1"]).train.epochs == 1
    with pytest.raises(UserError, match="train.batch_size"):
        load_params(path, ["train.batch_size=0"])
    with pytest.raises(UserError, match="train.bogus"):
        load_params(path, ["train.bogus=1"])


def test_override_into_empty_section() -> None:
    raw = apply_overrides({"train": None}, ["train.lr=1e-3"])
    assert raw == {"train": {"lr": 1e-3}}


# Method defaults ---------------------------------------------------------------------------


def test_method_defaults() -> None:
    params = params_from_dict({})
    assert params.method("scl").tau == 0.3 and params.method("scl").lam == 0.3
    assert params.method("romebert").grad_scope == "encoder-weights"
    assert params.method("acl").tau == 0.1 and params.method("acl").grad_scope == "encoder"
    assert params.method("acl-cl") == AclClKnobs()
    assert params.method("scl") == SclKnobs(tau=0.3, lam=0.3)


def test_method_section_merges_over_defaults() -> None:
    params = params_from_dict({
        "methods": {"scl": {"lam": 0.1}, "romebert": {"gamma": 0.5}, "acl": None},
    })  # fmt: skip
    assert params.method("scl").tau == 0.3  # the paper default survives a partial section
    assert params.method("scl").lam == 0.1
    assert params.method("romebert").grad_scope == "encoder-weights"
    assert params.method("romebert").gamma == 0.5
    assert params.method("acl") == AclKnobs()
    assert params_from_dict({"methods": {"scl": {"tau": 0.7}}}).method("scl").tau == 0.7


def test_set_overrides_method_default(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("{}\n", encoding="utf-8")
    assert load_params(path, ["methods.scl.tau=0.5"]).method("scl").tau == 0.5
    assert load_params(path, ["methods.scl.tau=0.5"]).method("scl").lam == 0.3


# The params file -------------------------------------------------------------------------


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / PARAMS
    path.write_text("train:\n  lr: 1e-5\n  epochs: [1, 2\nmodel:\n  name: x\n", encoding="utf-8")
    with pytest.raises(UserError) as exc:
        load_params(path)
    message = str(exc.value)
    assert str(path) in message and "not valid YAML" in message
    assert "line 4" in message, message  # where the parser found the unclosed list


def test_yaml_tab_indentation_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / PARAMS
    path.write_text("train:\n  lr: 1e-5\n\tepochs: 1\n", encoding="utf-8")
    with pytest.raises(UserError, match="line 3"):
        load_params(path)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / PARAMS
    path.write_bytes(b"train:\n  lr: \xff\xfe\n")
    with pytest.raises(UserError, match="UTF-8"):
        load_params(path)


def test_missing_named_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        load_params(tmp_path / "nope.yaml")


def test_missing_default_file_gives_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_params(PARAMS, ["train.epochs=2"]).train.epochs == 2


def test_file_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / PARAMS
    path.write_text("- train\n- model\n", encoding="utf-8")
    with pytest.raises(UserError, match="mapping"):
        load_params(path)


def test_repository_params_file_loads() -> None:
    path = REPO / PARAMS
    if not path.exists():
        pytest.skip("no params.yaml in the checkout")
    load_params(path)


# Method knobs: one typed record per method, strict ------------------------------------------


def test_each_method_has_its_own_knobs_record() -> None:
    params = params_from_dict({})
    expected = {
        "ce": NoKnobs,
        "scl": SclKnobs,
        "acl": AclKnobs,
        "joint": JointKnobs,
        "deebert": NoKnobs,
        "deebert-sd": DeebertSdKnobs,
        "romebert": RomebertKnobs,
        "acl-cl": AclClKnobs,
        "cosine-pairs": CosinePairsKnobs,
        "simcse-unsup": SimcseUnsupKnobs,
        "simcse-sup": SimcseSupKnobs,
    }
    assert {name: entry.knobs for name, entry in METHODS.items()} == expected
    for name, knobs in expected.items():
        assert type(params.method(name)) is knobs


def test_defaults_written_once() -> None:
    """docs/methods.md's defaults, from the records alone (no params.yaml section)."""
    params = params_from_dict({})
    assert params.method("acl").max_angle == 90.0
    assert params.method("acl-cl").max_angle == 90.0
    assert params.method("acl-cl").tau == 0.1 and params.method("acl-cl").lam_cl == 0.5
    assert params.method("romebert").gamma == 0.9 and params.method("romebert").T == 3.0
    assert params.method("deebert-sd") == DeebertSdKnobs(gamma=0.9, T=3.0)
    assert params.method("joint").weights == "uniform" and params.method("acl-cl").sd is False
    assert params.method("ce") == NoKnobs()


@pytest.mark.parametrize(
    ("section", "knob", "valid"),
    [
        ("ce", "max_angle", "takes no keys"),
        ("deebert", "gamma", "takes no keys"),
        ("joint", "tau", "valid keys of methods.joint are weights"),
        ("scl", "gamma", "valid keys of methods.scl are acl_grad, grad_scope, lam, max_angle, tau"),
        ("deebert-sd", "gr", "valid keys of methods.deebert-sd are T, gamma"),
        ("acl", "lam_cl", "acl_grad, grad_scope, lam, max_angle, tau"),
        ("romebert", "max_angle", "T, gamma, gr, grad_scope"),
    ],
)
def test_knob_the_method_does_not_read_is_rejected(section: str, knob: str, valid: str) -> None:
    message = user_error({"methods": {section: {knob: 1}}})
    assert message.startswith(f"unknown key methods.{section}.{knob}: ")
    assert valid in message


def test_unknown_knob_is_rejected_with_the_valid_keys() -> None:
    message = user_error({"methods": {"acl": {"temperature": 0.1}}})
    assert message == (
        "unknown key methods.acl.temperature: valid keys of methods.acl are "
        "acl_grad, grad_scope, lam, max_angle, tau"
    )


def test_knob_override_is_strict_too(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("{}\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"unknown key methods\.ce\.max_angle"):
        load_params(path, ["methods.ce.max_angle=45"])
    assert load_params(path, ["methods.acl.max_angle=45"]).method("acl").max_angle == 45.0


@pytest.mark.parametrize("path", [PARAMS, CAMPAIGN_PARAMS])
def test_shipped_params_files_are_accepted(path: str) -> None:
    """Every knob the shipped params files list is one its method reads, at docs/methods.md's
    default (the campaign's variants set theirs through --set-like overrides)."""
    import yaml

    from aclpipe.study.campaign.plan import load_campaign

    raw = yaml.safe_load((REPO / path).read_text(encoding="utf-8"))
    raw.pop("campaign", None)
    params = params_from_dict(raw)
    # the campaign's loader fills in the classification methods it runs (its runs record them);
    # cosine-pairs came after its runs, and the campaign does not run it
    methods = raw["methods"] if path == PARAMS else load_campaign(REPO / path).base["methods"]
    embeds = {name for name in METHODS if build_method(name, params.method(name)).embeds}
    later = {"cosine-pairs"}
    assert set(methods) == (
        set(METHODS) if path == "params.yaml" else set(METHODS) - embeds - later
    )
    for name, knobs in methods.items():
        assert set(knobs or {}) <= {f for f in params.method(name).__dataclass_fields__}
        assert params.method(name) == METHODS[name].knobs(), name


def test_each_section_checks_its_own_fields() -> None:
    """Range checks live beside each section's defaults (``RANGES``); a check under a name the
    section does not have would never run, so every name must be a field."""
    import dataclasses

    from aclpipe.checks import positive, range_check, unit
    from aclpipe.config import DataConfig, EvaluateConfig, ModelConfig, TrainConfig
    from aclpipe.training.knobs import KNOBS

    for cls in (DataConfig, ModelConfig, TrainConfig, EvaluateConfig, *KNOBS.values()):
        fields = {f.name for f in dataclasses.fields(cls)}
        for klass in cls.__mro__:
            assert set(vars(klass).get("RANGES", {})) <= fields, klass
    assert range_check(TrainConfig, "lr") is positive and range_check(TrainConfig, "seed") is None
    assert range_check(AclClKnobs, "gamma") is unit  # inherited from deebert-sd's record
    assert range_check(AclClKnobs, "tau") is positive  # and from acl's
    assert "must be in [0, 1]" in user_error({"methods": {"acl-cl": {"gamma": 2}}})
