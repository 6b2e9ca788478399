"""Each default written once: a study's params file holds only what it changes from the code's
defaults and its loader fills in the rest; ``aclpipe params show`` prints every value, as YAML
that loads back to the same config; bad input is one line."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import invoke, ok
from paths import REPO

from aclpipe.config import Params, load_params
from aclpipe.study.campaign.plan import load_campaign
from aclpipe.study.sts.study import load_study
from aclpipe.training.knobs import KNOBS

SPEC = {  # a small campaign: two tasks, a variant, a task's settings, two seeds
    "tasks": ["sst2", "mrpc"],
    "seeds": [1, 2],
    "runs": ["ce", "acl", "acl-nograd", "joint"],
    "variants": {"acl-nograd": {"method": "acl", "set": {"acl_grad": False}}},
    "task_settings": {"mrpc": {"data": {"max_length": 96}, "train": {"epochs": 2}}},
}


def every_value(methods: list[str]) -> dict[str, Any]:
    """A params mapping that writes every knob out, from the dataclasses' fields one by one (a
    plain reference: it does not ask the loader)."""

    def fields(cls: type) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(cls):
            has_factory = f.default_factory is not dataclasses.MISSING
            out[f.name] = f.default_factory() if has_factory else f.default
        return out

    hints = typing.get_type_hints(Params)  # section name -> its dataclass
    sections = {
        name: fields(hints[name]) for name in ("pipeline", "data", "model", "train", "evaluate")
    }
    return {**sections, "methods": {name: fields(KNOBS[name]) for name in methods}}


def write(path: Path, mapping: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(mapping, sort_keys=False), encoding="utf-8")
    return path


def planned(campaign) -> list[tuple[str, str, int]]:
    return [(t, r, s) for t in campaign.tasks for r in campaign.runs if t in campaign.tasks_for(r)
            for s in campaign.seeds_at(t, r)]  # fmt: skip


OVERRIDES = [  # (section, knob, value): one knob changed in each section a study writes
    ("pipeline", "tasks", ["mrpc"]),
    ("data", "validation_fraction", 0.2),
    ("data", "max_train_samples", 500),
    ("model", "pooling", "cls"),
    ("train", "lr", 3.0e-5),
    ("train", "seed", 7),
    ("evaluate", "timing_examples", 0),
    ("evaluate", "sweep", False),
    ("methods", "acl", {"tau": 0.2}),
    ("methods", "joint", {"weights": "linear"}),
]


@pytest.mark.parametrize(("section", "knob", "value"), OVERRIDES)
def test_one_override_resolves_as_the_full_file(
    tmp_path: Path, section: str, knob: str, value: Any
) -> None:
    """A study file that writes one knob gives every planned run the params, overrides and
    stage of a file that writes every value (the methods it runs in the registry's order)."""
    short = write(tmp_path / "short" / "params.yaml", {"campaign": SPEC, section: {knob: value}})
    full_values = every_value(["ce", "acl", "joint"])
    if section == "methods":
        full_values["methods"][knob].update(value)
    else:
        full_values[section][knob] = value
    full = write(tmp_path / "full" / "params.yaml", {"campaign": SPEC, **full_values})
    a, b = load_campaign(short), load_campaign(full)
    assert a.base == b.base and list(a.base["methods"]) == ["ce", "acl", "joint"]
    runs = planned(a)
    assert runs == planned(b) and len(runs) == 2 * 4 * 2
    for task, run, seed in runs:
        assert a.params(task, run, seed) == b.params(task, run, seed), (task, run, seed)
        assert a.overrides(task, run, seed) == b.overrides(task, run, seed)
        assert a.stage(task, run, seed) == b.stage(task, run, seed)


def test_a_study_file_keeps_the_methods_it_lists_and_adds_those_it_runs(tmp_path: Path) -> None:
    """A method section the file writes stays though no run trains it; the runs' methods join
    it, each at its defaults, in the registry's order; a misspelt method is one line."""
    path = write(tmp_path / "s" / "params.yaml",
                 {"campaign": SPEC, "methods": {"romebert": {"gr": False}, "scl": None}})  # fmt: skip
    base = load_campaign(path).base
    assert list(base["methods"]) == ["ce", "scl", "acl", "joint", "romebert"]
    assert base["methods"]["romebert"]["gr"] is False and base["methods"]["acl"]["tau"] == 0.1
    write(path, {"campaign": SPEC, "methods": {"acl-typo": {}}})
    with pytest.raises(Exception, match=r"unknown method section methods\.acl-typo: use one of"):
        load_campaign(path)


SHIPPED = [  # the campaigns' loaders build every planned run's params: seconds
    pytest.param("--campaign", "campaign/params.yaml", marks=pytest.mark.slow),
    pytest.param("--campaign", "fewshot/params.yaml", marks=pytest.mark.slow),
    ("--study", "sts/params.yaml"),
    ("--params", "params.yaml"),
]


def _loaded(flag: str, path: Path) -> Any:
    """What the loader behind ``flag`` reads from ``path``: the resolved shared knobs and the
    study's plan (a campaign), or the typed params (the pipeline's file)."""
    if flag == "--campaign":
        c = load_campaign(path)
        return c.base, c.runs, [c.overrides(t, r, s) for t, r, s in planned(c)]
    if flag == "--study":
        s = load_study(path)
        return s.raw, s.objectives, s.poolings, s.seeds, s.verdicts
    return load_params(path)


@pytest.mark.parametrize(("flag", "name"), SHIPPED)
def test_show_round_trips(tmp_path: Path, flag: str, name: str) -> None:
    """The printed YAML loads back to the same config, and prints the same text again."""
    printed = ok("params", "show", flag, str(REPO / name))
    again = tmp_path / Path(name).parent / "params.yaml"  # beside its own folder: same layout
    again.parent.mkdir(parents=True, exist_ok=True)
    again.write_text(printed, encoding="utf-8")
    assert _loaded(flag, again) == _loaded(flag, REPO / name)
    assert ok("params", "show", flag, str(again)).split("\n", 1)[1] == printed.split("\n", 1)[1]


@pytest.mark.slow
def test_show_prints_every_value_the_file_leaves_out() -> None:
    """The few-shot study's file leaves the head rate and the model out; show writes them."""
    shown = yaml.safe_load(ok("params", "show", "--campaign", str(REPO / "fewshot/params.yaml")))
    assert "head_lr" not in yaml.safe_load((REPO / "fewshot/params.yaml").read_text())["train"]
    reference = every_value(["ce", "scl", "acl"])
    assert set(shown) == {"campaign", *reference}
    for section, knobs in reference.items():
        assert set(shown[section]) == set(knobs), section
    assert shown["train"]["head_lr"] == reference["train"]["head_lr"]
    assert shown["train"]["batch_size"] == 20  # the file's own value
    assert shown["methods"]["acl"] == reference["methods"]["acl"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--campaign", "missing/params.yaml"], "campaign file missing/params.yaml not found"),
        (["--study", "missing.yaml"], "STS study file missing.yaml not found"),
        (["--params", "missing.yaml"], "params file missing.yaml not found"),
        (["--campaign", "BAD"], "is not valid YAML"),
        (["--study", "BAD"], "is not valid YAML"),
        (["--params", "BAD"], "is not valid YAML"),
        (["--campaign", "EMPTY"], "has no campaign: section"),
        (["--study", "EMPTY"], "has no sts: section"),
        (["--campaign", "a.yaml", "--study", "b.yaml"], "give --campaign or --study, not both"),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("BAD").write_text("train: [1, 2\n", encoding="utf-8")
    Path("EMPTY").write_text("train: {lr: 1.0e-5}\n", encoding="utf-8")
    result = invoke("params", "show", *args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


def test_show_without_a_params_file_prints_the_code_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    printed = ok("params", "show")
    assert printed.startswith("# the code's defaults\n")
    shown = yaml.safe_load(printed)
    reference = every_value(list(shown["methods"]))
    assert shown == reference and list(shown["methods"]) == []
