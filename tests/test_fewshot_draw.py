"""The few-shot draw (aclpipe.data.fewshot): class shares, one draw per seed, disjoint from the
validation split, recorded in meta.json, and one-line errors for an N the split cannot give."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from aclpipe.cli import app
from aclpipe.config import params_from_dict
from aclpipe.data.fewshot import allocate, stratified_ids
from aclpipe.data.glue_sources import Example, read_local
from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.stages.prepare import carve_validation, prepare

SST2, COLA = get_task("sst2"), get_task("cola")


def examples(counts: dict[int, int]) -> list[Example]:
    """Labels interleaved, ``counts[c]`` of class c."""
    left = dict(counts)
    out = []
    while any(left.values()):
        for c in sorted(left):
            if left[c]:
                out.append(Example(f"row {len(out)}", None, c))
                left[c] -= 1
    return out


def reference_allocation(n: int, sizes: dict[int, int]) -> dict[int, int]:
    """Hamilton's method written out with exact fractions: floors, then one more to the
    largest remainders, ties to the lower class."""
    total = sum(sizes.values())
    quotas = {c: Fraction(n * s, total) for c, s in sizes.items()}
    seats = {c: q.numerator // q.denominator for c, q in quotas.items()}
    order = sorted(sizes, key=lambda c: (-(quotas[c] - seats[c]), c))
    for c in order[: n - sum(seats.values())]:
        seats[c] += 1
    return seats


@pytest.mark.parametrize(
    ("n", "sizes"),
    [(20, {0: 2528, 1: 6023}), (100, {0: 2528, 1: 6023}), (7, {0: 5, 1: 5, 2: 5}),
     (20, {0: 50, 1: 50}), (1000, {0: 29780, 1: 37569}), (3, {0: 1, 1: 1, 2: 10})],
)  # fmt: skip
def test_allocation_keeps_class_shares(n: int, sizes: dict[int, int]) -> None:
    got = allocate(n, sizes)
    assert got == reference_allocation(n, sizes)
    assert sum(got.values()) == n and all(got[c] <= sizes[c] for c in sizes)
    total = sum(sizes.values())
    assert all(abs(got[c] - n * sizes[c] / total) < 1 for c in sizes)  # within one of the share


def test_draw_is_stratified_and_fixed_by_its_seed() -> None:
    pool = examples({0: 30, 1: 70})
    drawn = stratified_ids(COLA, pool, 20, seed=3)
    assert sorted(pool[i].label for i in drawn) == [0] * 6 + [1] * 14  # CoLA-like 30/70
    assert drawn == sorted(set(drawn)) and len(drawn) == 20
    assert stratified_ids(COLA, pool, 20, seed=3) == drawn  # the same seed, the same draw
    others = {tuple(stratified_ids(COLA, pool, 20, seed=s)) for s in range(1, 6)}
    assert len(others) == 5  # another seed, another draw


@pytest.mark.parametrize(
    ("n", "message"),
    [(101, "data.fewshot_examples is 101 but cola's training split has 100 examples"),
     (1, "too few for a stratified draw to give cola's class '0' an example"),
     (2, "draw at least 3")],
)  # fmt: skip
def test_an_n_the_split_cannot_give_is_one_line(n: int, message: str) -> None:
    pool = examples({0: 20, 1: 80})
    with pytest.raises(UserError, match=message) as err:
        stratified_ids(COLA, pool, n, seed=1)
    assert "\n" not in str(err.value)


def test_prepare_draws_from_train_without_the_validation_split(
    tmp_path: Path, params_dict, glue_dir: Path
) -> None:
    raw = params_dict(glue_dir, data={"validation_fraction": 0.25, "fewshot_examples": 10,
                                      "fewshot_seed": 4})  # fmt: skip
    params = params_from_dict(raw)
    meta = prepare(SST2, params.data, params.model.name, tmp_path / "d", glue_dir)
    rows = read_local(SST2, glue_dir, "train")
    _, held = carve_validation(SST2, rows, 0.25, params.data.seed)
    held_ids = {i for i, e in enumerate(rows) if any(e is h for h in held)}
    draw = meta["fewshot"]
    assert len(held_ids) == 12 and draw["drawn_from"] == 36  # 48 rows, a quarter held out
    assert len(draw["ids"]) == 10 and not set(draw["ids"]) & held_ids  # disjoint
    assert draw["per_stratum"] == {"0": 5, "1": 5} and draw["seed"] == 4
    written = [json.loads(line) for line in (tmp_path / "d/train.jsonl").read_text().splitlines()]
    assert [r["label"] for r in written] == [rows[i].label for i in draw["ids"]]
    # the rows written are the drawn rows themselves, not others with the same labels
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(params.model.name)
    expected = [
        tokenizer(rows[i].text_a, truncation=True, max_length=params.data.max_length)["input_ids"]
        for i in draw["ids"]
    ]
    assert [r["input_ids"] for r in written] == expected
    assert not (tmp_path / "d/validation.jsonl").exists()  # no validation split is written
    assert set(meta["splits"]) == {"train", "dev"} and meta["splits"]["dev"]["examples"] == 16
    again = prepare(SST2, params.data, params.model.name, tmp_path / "e", glue_dir)
    assert again["fewshot"]["ids"] == draw["ids"]


def test_prepare_cli_errors_are_one_line(tmp_path: Path, params_dict, glue_dir, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text(yaml.safe_dump(params_dict(glue_dir)), encoding="utf-8")
    for sets, message in [
        (["data.fewshot_examples=49"], "data.fewshot_examples is 49 but sst2's training split"),
        (["data.fewshot_examples=0"], "data.fewshot_examples must be > 0"),
        (["data.fewshot_examples=8", "data.max_train_samples=20"], "both set"),
    ]:
        args = ["prepare", "--task", "sst2"] + [a for s in sets for a in ("--set", s)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not Path("data/sst2").exists()  # nothing half-written
