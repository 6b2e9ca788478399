"""A tiny few-shot study end to end on the tiny model: the campaign's runner with N as one more
axis (draws prepared per seed, runs named <run>-n<N>), its records, and its report."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import cli_helpers
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from aclpipe.cli import app
from aclpipe.errors import UserError
from aclpipe.layout import RUN_RECORD, Layout
from aclpipe.study.campaign.plan import load_campaign
from aclpipe.study.campaign.runs import environment as campaign_environment
from aclpipe.study.campaign.stack_check import stack
from aclpipe.study.fewshot import wallclock
from aclpipe.study.fewshot.report import (
    BELOW,
    ON,
    _weighted_sd,
    against_majority,
    quantiles,
    spread_claim,
    spread_ratio,
)
from aclpipe.study.stats.measures import Measure
from aclpipe.study.stats.verdicts import Rules

STUDY = {
    "tasks": ["sst2"],
    "seeds": [1, 2, 3],
    "runs": ["ce", "acl-nograd"],
    "verdicts": {"resamples": 2000},
    "variants": {"acl-nograd": {"method": "acl", "set": {"acl_grad": False}}},
    "fewshot": [4, 8],
    "fewshot_settings": {4: {"train": {"epochs": 3}}, 8: {"train": {"epochs": 2}}},
}


def write_study(folder: Path, base: dict, **spec) -> Path:
    return cli_helpers.write_study(folder, base, STUDY, **spec)


def test_study_params_set_the_draw_the_recipe_and_the_seed(tmp_path, params_dict) -> None:
    study = load_campaign(write_study(tmp_path, params_dict(None)))
    assert study.runs == ["ce-n4", "acl-nograd-n4", "ce-n8", "acl-nograd-n8"]
    params = study.params("sst2", "acl-nograd-n8", 3)
    assert (params.data.fewshot_examples, params.data.fewshot_seed, params.train.seed) == (8, 3, 3)
    assert params.train.epochs == 2 and params.method("acl").acl_grad is False
    assert study.data_dir("sst2", "ce-n8", 3) == tmp_path / "fewshot/data/sst2/s3/n8"
    assert study.stage("sst2", "ce-n8", 3) == "run@3-sst2-8-ce"  # fewshot/dvc.yaml's matrix


def test_pending_runs_go_n_by_n_then_seed_by_seed(tmp_path, params_dict) -> None:
    from aclpipe.study.campaign.runner import pending

    study = load_campaign(write_study(tmp_path, params_dict(None), tasks=["sst2", "rte"]))
    study.run_dir("sst2", "ce-n4", 1).mkdir(parents=True)  # done: not pending
    jobs = pending(study)
    assert len(jobs) == 2 * 4 * 3 - 1
    n4 = [(t, r, s) for s in (1, 2, 3) for t in ("sst2", "rte") for r in ("ce-n4", "acl-nograd-n4")]
    n8 = [(t, r, s) for s in (1, 2, 3) for t in ("sst2", "rte") for r in ("ce-n8", "acl-nograd-n8")]
    assert jobs == [job for job in n4 if job != ("sst2", "ce-n4", 1)] + n8
    assert pending(study, seeds=[2], tasks=["rte"]) == [
        ("rte", "ce-n4", 2), ("rte", "acl-nograd-n4", 2), ("rte", "ce-n8", 2), ("rte", "acl-nograd-n8", 2)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "message"),
    [({"fewshot": [8, 4]}, "each N once, ascending"),
     ({"fewshot": [0]}, "whole numbers > 0"),
     ({"fewshot_settings": {5: {"train": {}}}}, "not an N of campaign.fewshot"),
     ({"fewshot_settings": {4: {"methods": {}}}}, "only data, train"),
     ({"ablations": ["scl"]}, "no ablations")],
)  # fmt: skip
def test_bad_study_files_fail_in_one_line(tmp_path, params_dict, spec, message) -> None:
    with pytest.raises(UserError, match=message):
        load_campaign(write_study(tmp_path, params_dict(None), **spec))


def test_weighted_sd_is_the_sd_of_the_drawn_multiset() -> None:
    rng = np.random.default_rng(0)
    values, counts = rng.normal(size=(5, 4)), rng.integers(0, 3, size=(5, 4))
    counts[:, 0] += 2  # at least two draws per resample
    for r in range(5):
        multiset = np.repeat(values[r], counts[r])
        assert _weighted_sd(values, counts)[r] == pytest.approx(np.std(multiset, ddof=1))


def test_spread_ratio_against_a_constant_baseline_is_infinite_and_of_itself_one() -> None:
    from aclpipe.data.tasks import get_task

    task, rng = get_task("sst2"), np.random.default_rng(1)
    labels = rng.integers(0, 2, 40)
    runs = {s: Measure("final", rng.integers(0, 2, (1, 40))) for s in range(1, 6)}
    same = spread_ratio(task, runs, runs, labels, resamples=200)
    assert same["ratio"] == pytest.approx(1.0) and same["low"] == same["high"] == pytest.approx(1)
    assert same["verdict"] == "inconclusive"
    constant = {s: Measure("final", np.zeros((1, 40), dtype=int)) for s in range(1, 6)}
    varied = spread_ratio(task, runs, constant, labels, 200)  # B never varies, A does
    assert varied["ratio"] is None and varied["high"] == np.inf and varied["verdict"] == "higher"
    steady = spread_ratio(task, constant, constant, labels, 200)  # 0 / 0 in every resample
    assert steady["verdict"] == "undefined (neither varies over the draws)"
    assert steady["undefined_share"] == 1.0


def test_spread_ratio_needs_four_draws_and_says_why_it_has_no_interval() -> None:
    """3 draws: 3 of the 27 equally likely resamples of the seeds repeat one seed (about 11%,
    past the 2.5% a 95% interval can leave out), so S2 asks for 4 (4 of 256, 1.6%). Where
    draws 1-3 score alike for both methods, (3/4)^4 = 32% of the resamples have neither sd above
    0: no interval, and the verdict says how often."""
    from aclpipe.data.tasks import get_task

    task, rng = get_task("sst2"), np.random.default_rng(2)
    labels = rng.integers(0, 2, 60)
    runs = {s: Measure("final", rng.integers(0, 2, (1, 60))) for s in range(1, 5)}
    other = {s: Measure("final", rng.integers(0, 2, (1, 60))) for s in range(1, 5)}
    three = spread_ratio(task, {s: runs[s] for s in (1, 2, 3)}, other, labels, resamples=400)
    assert three == {"draws": [1, 2, 3], "verdict": "too few draws (4 needed)"}
    four = spread_ratio(task, runs, other, labels, resamples=4000)
    assert four["undefined_share"] == pytest.approx(4 / 256, abs=0.01) and four["low"] is not None
    alike = {s: runs[1] for s in (1, 2, 3)} | {4: runs[4]}
    alike_b = {s: other[1] for s in (1, 2, 3)} | {4: other[4]}
    found = spread_ratio(task, alike, alike_b, labels, resamples=4000)
    assert found["sd_b"] > 0 and found["low"] is None
    assert found["undefined_share"] == pytest.approx(0.75**4, abs=0.03)
    assert found["verdict"] == (
        f"undefined (neither sd above 0 in {found['undefined_share']:.0%} of the resamples: "
        "too few distinct draws)"
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantiles_are_numpys_and_reach_inf_where_they_interpolate_towards_it(seed) -> None:
    values = np.random.default_rng(seed).normal(size=41)
    values[[3, 7]] = np.nan
    assert quantiles(values, [0.025, 0.5, 0.975]) == list(np.nanquantile(values, [0.025, 0.5, 0.975]))
    # by hand: 0..9 and one inf, 11 values: q 0.5 sits on 5; q 0.95 between 9 and inf
    values = np.r_[np.arange(10.0), np.inf, np.nan]
    assert quantiles(values, [0.0, 0.5, 0.9, 0.95, 1.0]) == [0.0, 5.0, 9.0, np.inf, np.inf]


def test_a_method_is_above_on_or_below_the_majority_class() -> None:
    from aclpipe.data.tasks import get_task
    from aclpipe.study.fewshot.markdown import _on_majority

    task = get_task("sst2")
    labels = np.array([1] * 30 + [0] * 10)  # the majority guess (1) scores 75%
    floor = {s: Measure("final", np.ones((1, 40), dtype=int)) for s in (1, 2, 3)}
    perfect = {s: Measure("final", labels[None]) for s in (1, 2, 3)}
    minority = {s: Measure("final", np.zeros((1, 40), dtype=int)) for s in (1, 2, 3)}  # 25%
    mixed = {s: Measure("final", np.r_[np.ones(38), np.zeros(2)][None].astype(int)) for s in (1, 2, 3)}
    verdict = {name: against_majority(task, runs, floor, labels, Rules(resamples=200))["verdict"]
               for name, runs in (("ce", perfect), ("scl", minority), ("acl", mixed))}  # fmt: skip
    assert verdict == {"ce": "better", "scl": BELOW, "acl": ON}  # acl: 2 more of 40 right, not told apart
    cell = {"task": "sst2", "n": 20, "majority": 0.75,
            "runs": {r: {"vs_majority": {"verdict": v}} for r, v in verdict.items()}}  # fmt: skip
    assert _on_majority([cell]) == ["- sst2 at N = 20: scl, acl at or below the majority class (75.0); scl below it"]
    cell["runs"]["ce"]["vs_majority"]["verdict"] = ON
    assert _on_majority([cell])[0].endswith("(75.0); scl below it: its comparisons are uninformative")
    cell["task"] = "cola"  # under Matthews correlation a constant guess scores 0 whatever it guesses
    assert _on_majority([cell])[0].startswith("- cola at N = 20: every method at or below chance (MCC 0);")


def test_a_spread_between_majority_guessers_is_uninformative() -> None:
    from aclpipe.data.tasks import get_task

    task, rng = get_task("sst2"), np.random.default_rng(2)
    labels = rng.integers(0, 2, 40)
    measures = {run: {s: Measure("final", rng.integers(0, 2, (1, 40))) for s in range(1, 9)}
                for run in ("ce", "scl")}  # fmt: skip
    bases = ["ce", "scl", "acl"]
    judged = spread_claim(task, measures, "scl", "ce", bases, {"scl"}, labels, 200)
    assert judged["verdict"] in {"lower", "higher", "inconclusive"} and judged["low"] is not None
    assert judged == spread_ratio(task, measures["scl"], measures["ce"], labels, 200)
    unjudged = spread_claim(task, measures, "scl", "ce", bases, set(), labels, 200)
    assert unjudged == {**judged, "verdict": "uninformative"}  # the numbers stay, shown
    # only A's beating the majority class makes its spread mean something: a method that
    # collapses onto one class on every draw has no spread, and is no steadier for it
    assert spread_claim(task, measures, "scl", "ce", bases, {"ce"}, labels, 200)["verdict"] == "uninformative"
    collapsed = {**measures, "scl": {s: Measure("final", np.zeros((1, 40), dtype=int)) for s in range(1, 9)}}
    found = spread_claim(task, collapsed, "scl", "ce", bases, {"ce"}, labels, 200)
    assert found["high"] == 0.0 and found["verdict"] == "uninformative"  # the ratio alone says "lower"
    assert spread_claim(task, measures, "acl", "ce", bases, set(), labels)["verdict"] == "not run yet"
    assert spread_claim(task, measures, "acl", "ce", ["ce"], set(), labels)["verdict"] == "not in this study"
    few = {run: dict(list(m.items())[:2]) for run, m in measures.items()}
    assert spread_claim(task, few, "scl", "ce", bases, set(), labels)["verdict"].startswith("too few")


def reference_bootstrap(a: np.ndarray, b: np.ndarray, resamples: int) -> np.ndarray:
    """``[R]``: A - B by a plain loop over resamples. ``a``, ``b`` ``[seeds, examples]``: each
    example right (1) or wrong (0) on the seed's run. Each resample draws examples, then seeds,
    with replacement (paired.draw's recipe: numpy's default_rng(0), example indices first), and
    both runs of a drawn seed are scored on the drawn examples."""
    rng = np.random.default_rng(0)
    examples = rng.integers(0, a.shape[1], (resamples, a.shape[1]))
    seeds = rng.integers(0, a.shape[0], (resamples, a.shape[0]))
    return np.array([
        np.mean([a[s, examples[r]].mean() - b[s, examples[r]].mean() for s in seeds[r]])
        for r in range(resamples)
    ])  # fmt: skip


def reference_sd_ratio(a: np.ndarray, b: np.ndarray, resamples: int) -> np.ndarray:
    """``[R]``: A's sd over the drawn seeds over B's, each seed's score on the drawn examples;
    +inf where only B's sd is 0, NaN where both are."""
    rng = np.random.default_rng(0)
    examples = rng.integers(0, a.shape[1], (resamples, a.shape[1]))
    seeds = rng.integers(0, a.shape[0], (resamples, a.shape[0]))

    def sd(runs: np.ndarray, r: int) -> float:
        return float(np.std([runs[s, examples[r]].mean() for s in seeds[r]], ddof=1))

    def ratio(r: int) -> float:
        top, bottom = sd(a, r), sd(b, r)
        return top / bottom if bottom > 1e-12 else np.inf if top > 1e-12 else np.nan

    return np.array([ratio(r) for r in range(resamples)])


def test_tiny_study_end_to_end(tmp_path: Path, params_dict, glue_dir: Path, monkeypatch) -> None:
    glue = tmp_path / "glue"  # SST-2's 16 dev rows, 12 times: enough examples to resample
    shutil.copytree(glue_dir, glue)
    header, *rows = (glue / "SST-2/dev.tsv").read_text().splitlines(keepends=True)
    (glue / "SST-2/dev.tsv").write_text(header + "".join(rows * 12))
    seeds = (1, 2, 3, 4)  # 4 draws: a resample draws one draw 4 times at 1.6% (S2 needs < 2.5%)
    write_study(tmp_path, params_dict(glue), runs=["ce", "scl", "acl", "acl-nograd"], seeds=list(seeds))
    monkeypatch.chdir(tmp_path)
    runner, flag = CliRunner(), ["--campaign", "fewshot/params.yaml"]
    result = runner.invoke(app, ["campaign", "run-pending", "--workers", "1", *flag])
    assert result.exit_code == 2 and "fewshot/data/sst2/s1/n4 is not prepared" in result.output
    assert "--seed 1" in result.output
    result = runner.invoke(app, ["campaign", "prepare", *flag])  # every seed's draws
    assert result.exit_code == 0 and "(draw of 8, seed 3)" in result.output, result.output
    args = ["campaign", "run", "--task", "sst2", "--run", "ce-n4", "--seed", "1", *flag]
    assert runner.invoke(app, args).exit_code == 0  # one run, as a DVC stage runs it
    result = runner.invoke(app, ["campaign", "run-pending", "--workers", "2", *flag])
    assert result.exit_code == 0 and "31 runs to do, 2 at a time" in result.output, result.output
    assert "fewshot/dvc.yaml:run@3-sst2-8-acl-nograd" in " ".join(result.output.split())
    records = {
        p.parent.name: json.loads(p.read_text())
        for p in (tmp_path / "fewshot/runs/sst2").glob("*/run.json")
    }
    assert len(records) == 32
    for name, record in records.items():  # the draw is recorded with every run
        run, n, seed = name.rsplit("-n", 1)[0], *map(int, name.rsplit("-n", 1)[1].split("-s"))
        draw = record["data"]["fewshot"]
        assert (draw["examples"], draw["seed"], record["params"]["train"]["seed"]) == (n, seed, seed)
        twin = records[f"{'ce' if run != 'ce' else 'acl-nograd'}-n{n}-s{seed}"]
        assert twin["data"]["fewshot"]["ids"] == draw["ids"]  # one draw per seed, every method
        assert "validation" not in record["data"]["splits"]  # no validation split scored
    assert records["ce-n4-s1"]["data"]["fewshot"]["ids"] != records["ce-n4-s2"]["data"]["fewshot"]["ids"]
    result = runner.invoke(app, ["campaign", "report", *flag])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "reports/fewshot/results.json").read_text())
    cell = next(c for c in summary["cells"] if c["n"] == 8)
    assert cell["finished"] == cell["planned"] == 16
    ce = cell["runs"]["ce"]
    metrics = [
        json.loads((tmp_path / f"fewshot/runs/sst2/ce-n8-s{s}/metrics.json").read_text())
        for s in seeds
    ]
    finals = [m["final_score"] for m in metrics]
    assert ce["mean"] == pytest.approx(np.mean(finals)) and ce["n"] == 4
    assert ce["sd"] == pytest.approx(np.std(finals, ddof=1))
    assert cell["majority"] == metrics[0]["splits"]["dev"]["majority_score"]
    # the tiny model guesses the majority class, so every claim would be uninformative: to
    # reach the verdicts, the test sets each run's dev logits (each example right with a chance
    # per method, drawn anew per run) and reports again
    rng = np.random.default_rng(7)
    chance = {"ce": 0.55, "scl": 0.8, "acl": 0.85, "acl-nograd": 0.85}
    for folder in sorted((tmp_path / "fewshot/runs/sst2").iterdir()):
        npz = dict(np.load(folder / "predictions.npz"))
        labels = npz["dev_labels"]
        hit = rng.random(len(labels)) < chance[folder.name.rsplit("-n", 1)[0]]
        logits = np.zeros_like(npz["dev_logits"])
        logits[-1, np.arange(len(labels)), np.where(hit, labels, 1 - labels)] = 1.0
        np.savez(folder / "predictions.npz", **{**npz, "dev_logits": logits})
    assert runner.invoke(app, ["campaign", "report", *flag]).exit_code == 0
    summary = json.loads((tmp_path / "reports/fewshot/results.json").read_text())
    # every figure against a plain bootstrap written here, from the run folders' logits
    def right(run: str, n: int) -> np.ndarray:  # [seeds, dev examples]: final exit right
        out = []
        for seed in seeds:
            npz = np.load(tmp_path / f"fewshot/runs/sst2/{run}-n{n}-s{seed}/predictions.npz")
            out.append((npz["dev_logits"][-1].argmax(-1) == npz["dev_labels"]).astype(float))
        return np.stack(out)

    judged = 0
    for cell in summary["cells"]:
        n, informative = cell["n"], set()
        for run, entry in cell["runs"].items():
            ours = right(run, n)
            assert entry["scores"] == {str(s): pytest.approx(v) for s, v in zip(seeds, ours.mean(axis=1))}
            counts = records[f"{run}-n{n}-s1"]["data"]["splits"]["train"]["labels"]
            guess = np.argmax([counts[name] for name in ("0", "1")])  # ties to the lower class
            labels = np.load(tmp_path / f"fewshot/runs/sst2/{run}-n{n}-s1/predictions.npz")["dev_labels"]
            floor = np.broadcast_to((labels == guess).astype(float), ours.shape)
            diffs = reference_bootstrap(ours, floor, 2000)
            vs = entry["vs_majority"]
            assert vs["difference"] == pytest.approx(float((ours - floor).mean()))
            assert [vs["low"], vs["high"]] == pytest.approx(list(np.quantile(diffs, [0.025, 0.975])))
            informative |= {run} if vs["verdict"] == "better" else set()
        for row in cell["claims"]:
            a, b = right(row["a"], n), right(row["b"], n)
            diffs = reference_bootstrap(a, b, 2000)
            assert row["difference"] == pytest.approx(float((a - b).mean()))
            assert [row["low"], row["high"]] == pytest.approx(list(np.quantile(diffs, [0.025, 0.975])))
            tails = {  # (k + 1) / (R + 1), one-sided
                "better": (np.sum(diffs <= 1e-12) + 1) / 2001,
                "worse": (np.sum(diffs >= -1e-12) + 1) / 2001,
                "comparable": (np.sum(diffs <= -0.01 + 1e-12) + 1) / 2001,
            }
            assert [row[f"p_{k}"] for k in tails] == pytest.approx(list(tails.values()))
            word = next((k for k, p in tails.items() if p <= 0.025), "inconclusive")
            if not {row["a"], row["b"]} & informative:
                word = "uninformative"
            elif row["claim"] == "A3":
                assert 0 <= row["rule_altered"] <= 1 and row["rule_steps"] > 0  # acl's own log
                word = word if row["rule_exercised"] else "rule not exercised"
            assert row["verdict"] == word
            kind_holds = word == "better" or (row["kind"] == "non-inferiority" and word == "comparable")
            assert row["holds"] is kind_holds
            judged += word in ("better", "worse", "comparable", "inconclusive")
            assert ("holm_p" in row) is (word in ("better", "worse", "comparable", "inconclusive"))
        for row in cell["spreads"]:
            a, b = right(row["a"], n), right(row["b"], n)
            assert row["sd_a"] == pytest.approx(float(np.std(a.mean(axis=1), ddof=1)))
            ratios = reference_sd_ratio(a, b, 2000)
            if row["low"] is not None:
                expected = quantiles(ratios, [0.025, 0.975])  # numpy's, +inf kept (tested above)
                assert [row["low"], row["high"]] == pytest.approx(list(expected))
                if row["a"] not in informative:
                    assert row["verdict"] == "uninformative"
    assert judged >= 6  # the logits set above reach the verdicts, not just "uninformative"
    # a rule floor above every rate the runs logged: A3 tests nothing, and leaves the family
    raw = yaml.safe_load((tmp_path / "fewshot/params.yaml").read_text())
    raw["campaign"]["verdicts"]["rule_floor"] = 0.99
    (tmp_path / "fewshot/params.yaml").write_text(yaml.safe_dump(raw))
    assert runner.invoke(app, ["campaign", "report", *flag]).exit_code == 0
    floored = json.loads((tmp_path / "reports/fewshot/results.json").read_text())
    a3 = [r for c in floored["cells"] for r in c["claims"] if r["claim"] == "A3"]
    assert [(r["verdict"], r["holds"], "holm_p" in r) for r in a3] == [("rule not exercised", False, False)] * 2
    readme = (tmp_path / "reports/fewshot/README.md").read_text()
    assert "Runs done: 32 of 32" in readme and "## sst2" in readme and "(provisional:" not in readme
    here = stack({"environment": campaign_environment("cpu")})  # these runs name their CPU
    assert f"- {here}: 32 runs" in readme and "do not name their CPU" not in readme
    assert "## Verdicts at a glance" in readme and "| task | N | S1 scl - ce |" in readme
    assert "| verdict | holds |" in readme and "rule not exercised" in readme
    for png in ("fewshot_scores.png", "fewshot_spread.png"):
        assert (tmp_path / "reports/fewshot" / png).read_bytes()[:4] == b"\x89PNG"


def test_prepare_seed_needs_a_few_shot_study(tmp_path, params_dict, monkeypatch) -> None:
    path = tmp_path / "campaign" / "params.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump({**params_dict(None), "campaign": {
        "tasks": ["sst2"], "seeds": [1], "runs": ["ce"]}}), encoding="utf-8")  # fmt: skip
    args = ["campaign", "prepare", "--seed", "1", "--campaign", str(path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "has no campaign.fewshot" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_campaign_params_prints_an_ordinary_params_file(tmp_path, params_dict, monkeypatch) -> None:
    from aclpipe.config import params_from_dict

    path = write_study(tmp_path, params_dict(None))
    args = ["campaign", "params", "--task", "sst2", "--run", "acl-nograd-n8", "--seed", "2"]
    result = CliRunner().invoke(app, [*args, "--campaign", str(path)])
    assert result.exit_code == 0, result.output
    assert "aclpipe finetune --params FILE --task sst2 --method acl" in result.output
    params = params_from_dict(yaml.safe_load(result.output))  # the comments are YAML comments
    assert params == load_campaign(path).params("sst2", "acl-nograd-n8", 2)
    assert (params.data.fewshot_examples, params.data.fewshot_seed, params.train.seed) == (8, 2, 2)
    result = CliRunner().invoke(app, [*args[:-1], "7", "--campaign", str(path)])
    assert result.exit_code == 2 and "seed 7 is not in campaign.seeds" in result.output
    # a glue_dir relative to the study's working folder is printed absolute: the run can be
    # redone in a folder of its own, away from the default pipeline's data/ and models/
    path = write_study(tmp_path, params_dict(Path("../shared/glue")))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [*args, "--campaign", str(path)])
    assert result.exit_code == 0 and "in an empty folder" in result.output
    assert yaml.safe_load(result.output)["data"]["glue_dir"] == str(tmp_path.parent / "shared/glue")


# the study's wall clock (aclpipe.study.fewshot.wallclock): runs timed from their logs, merged into
# the ledger, summed into the union of their intervals
T0 = 1_796_400_000  # 2026-12-04T16:00:00 UTC


@pytest.mark.parametrize(
    ("intervals", "union"),
    [([], 0), ([(0, 10)], 10), ([(0, 10), (5, 15), (20, 30)], 25), ([(0, 10), (2, 3)], 10),
     ([(20, 30), (0, 10), (10, 20)], 30), ([(0, 5), (1, 2), (3, 8)], 8)],
)  # fmt: skip
def test_union_counts_overlapping_runs_once_and_gaps_not_at_all(intervals, union) -> None:
    assert wallclock.union_seconds(intervals) == union


def finish(root: Path, task: str, run: str, seed: int, start: int, end: int) -> None:
    """A finished run under the study folder ``root``: its folder with run.json, its log with
    modification time ``end`` (birth times are the file system's: the test fixes them)."""
    layout = Layout(root)
    (layout.run(task, run, seed)).mkdir(parents=True)
    (layout.run(task, run, seed) / RUN_RECORD).write_text("{}")
    log = layout.run_log(task, run, seed)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"started {start}\n")
    os.utime(log, (end, end))


def test_record_times_finished_runs_and_keeps_earlier_rows(
    tmp_path: Path, params_dict, monkeypatch
) -> None:
    study = load_campaign(write_study(tmp_path, params_dict(None)))
    # the test's birth time: the log's first line (real logs: the file system's)
    monkeypatch.setattr(
        wallclock, "born_and_modified",
        lambda log: (int(log.read_text().split()[1]), int(log.stat().st_mtime)),
    )  # fmt: skip
    worktree = tmp_path / "worktree" / "fewshot"
    finish(worktree, "sst2", "ce-n4", 1, T0, T0 + 60)
    finish(worktree, "sst2", "acl-nograd-n4", 1, T0 + 30, T0 + 100)  # side by side
    Layout(worktree).run_log("sst2", "ce-n8", 2).write_text(f"started {T0}\n")  # still running
    path, rows = wallclock.record(study, worktree)
    assert (path, len(rows)) == (study.root / wallclock.LEDGER, 2)
    first = wallclock.read(path)
    assert first == rows  # what it returns is what it wrote
    assert first[0] == {"task": "sst2", "run": "acl-nograd", "n": "4", "seed": "1",
                        "start_utc": "2026-12-04T16:00:30", "end_utc": "2026-12-04T16:01:40",
                        "seconds": "70", "note": ""}  # fmt: skip
    # a later run from another checkout: the first one's logs are gone, its rows stay
    later = tmp_path / "later" / "fewshot"
    finish(later, "sst2", "ce-n8", 1, T0 + 7200, T0 + 7210)
    _, rows = wallclock.record(study, later)
    summary = wallclock.summarise(wallclock.read(path))
    assert len(rows) == summary["runs"] == 3
    assert summary["run_seconds"] == 60 + 70 + 10
    assert summary["wall_seconds"] == 100 + 10  # [T0, T0 + 100] and the later run
    assert [(c["n"], c["runs"], c["run_seconds"]) for c in summary["cells"]] == [(4, 2, 130), (8, 1, 10)]
    assert [(c["min_seconds"], c["max_seconds"]) for c in summary["cells"]] == [(60, 70), (10, 10)]
    assert (summary["first"], summary["last"]) == ("2026-12-04T16:00:00", "2026-12-04T18:00:10")
    assert summary["notes"] == []
    # a row corrected by hand says why, and a log read again does not overwrite it
    ledger = path.read_text().replace(
        "2026-12-04T16:00:00\t2026-12-04T16:01:00\t60\t", "2026-12-04T16:00:20\t2026-12-04T16:01:00\t40\trerun"
    )  # fmt: skip
    path.write_text(ledger)
    _, rows = wallclock.record(study, worktree)  # its log still gives 16:00:00
    corrected = [r for r in rows if r["note"]]
    assert [(r["run"], r["start_utc"], r["seconds"], r["note"]) for r in corrected] == [
        ("ce", "2026-12-04T16:00:20", "40", "rerun")
    ]
    assert wallclock.summarise(rows)["notes"] == corrected
    # the report counts the runs finished in its own checkout only
    assert wallclock.finished_here(study, wallclock.read(path)) == []
    finish(study.root, "sst2", "ce-n8", 1, T0, T0 + 1)
    assert [r["n"] for r in wallclock.finished_here(study, wallclock.read(path))] == ["8"]


def test_wall_clock_section_gives_each_cells_mean_fastest_and_slowest(tmp_path, params_dict) -> None:
    from aclpipe.study.fewshot.provenance import wallclock_lines

    study = load_campaign(write_study(tmp_path, params_dict(None)))
    rows = [
        {"task": "sst2", "run": run, "n": "4", "seed": "1", "start_utc": start,
         "end_utc": end, "seconds": seconds}
        for run, start, end, seconds in [
            ("ce", "2026-12-04T16:00:00", "2026-12-04T16:01:00", "60"),
            ("scl", "2026-12-04T16:00:30", "2026-12-04T16:02:30", "120"),
        ]
    ]  # fmt: skip
    text = "\n".join(wallclock_lines(study, wallclock.summarise(rows), finished=3))
    assert "2 of the 3 finished runs are timed (1 ran before the ledger, untimed)" in text
    assert "| 4 | sst2 | 2 | 90 (60-120) | 0.05 |" in text and "Corrected by hand" not in text
    assert wallclock_lines(study, None, finished=3) == []
    rows[1]["note"] = "rerun after a kill"
    text = "\n".join(wallclock_lines(study, wallclock.summarise(rows), finished=3))
    assert "- Corrected by hand: sst2 scl N = 4 seed 1, 2026-12-04T16:00:30 to 2026-12-04T16:02:30: rerun after a kill" in text


def test_verdicts_at_a_glance_give_each_claim_in_a_few_words() -> None:
    from aclpipe.study.fewshot.markdown import _glance, _glance_claim

    def claim(name, a, b, diff, verdict, holds, seeds=10, **holm):
        return {"claim": name, "a": a, "b": b, "difference": diff, "verdict": verdict,
                "holds": holds, "seeds": list(range(seeds)), **holm}  # fmt: skip

    def spread(a, ratio, low, high, verdict, draws=10):
        return {"claim": "S2", "a": a, "b": "ce", "sd_a": 0.05, "ratio": ratio, "low": low,
                "high": high, "verdict": verdict, "draws": list(range(draws))}  # fmt: skip

    cells = [
        {"task": "sst2", "n": 20, "claims": [
            claim("S1", "scl", "ce", 0.018, "better", True, holm_p=0.01, family_wise=True),
            claim("A1", "acl", "scl", -0.009, "worse", False, holm_p=0.046, family_wise=False),
        ], "spreads": [spread("scl", 1.18, 0.96, 1.47, "inconclusive")]},
        {"task": "sst2", "n": 1000, "claims": [
            claim("S1", "scl", "ce", 0.005, "comparable", False, seeds=3, holm_p=0.2,
                  family_wise=False),
            claim("A1", "acl", "scl", -0.02, "uninformative", False),
        ], "spreads": [spread("scl", None, None, None, "too few draws (4 needed)", draws=3)]},
        {"task": "rte", "n": 20, "runs": {}},  # nothing finished: no row
    ]  # fmt: skip
    lines = _glance(cells, planned=10)
    assert lines[0] == "| task | N | S1 scl - ce | A1 acl - scl | S2 sd scl / ce |"
    assert lines[2] == (
        "| sst2 | 20 | +1.8 better, holds | -0.9 worse (not after Holm) "
        "| 1.18 [0.96, 1.47] inconclusive |"
    )
    assert lines[3] == (
        "| sst2 | 1000 | +0.5 comparable (not after Holm) (3 of 10 draws) | -2.0 uninformative "
        "| too few draws (4 needed) |"
    )
    # an inconclusive verdict has nothing for Holm to undo: no mark
    unjudged = claim("A1", "acl", "ce", -0.016, "inconclusive", False, holm_p=1.0, family_wise=False)
    assert _glance_claim(unjudged, 10) == "-1.6 inconclusive"
    assert len(lines) == 4 and _glance([{"task": "rte", "n": 20, "runs": {}}], 10) == []


def test_stacks_section_counts_runs_per_stack_and_says_which_lack_their_cpu() -> None:
    from aclpipe.study.fewshot.provenance import stacks_lines

    old = "cpu, torch 2.13.0+cpu, transformers 5.25.0, Python 3.11.7"  # before run.json named it
    new = "cpu: AMD EPYC (family 25, model 17), torch 2.13.0+cpu, transformers 5.25.0, Python 3.11.7"
    cells = [{"stacks": {old: 3, new: 1}}, {"stacks": {old: 2}}, {"runs": {}}]
    text = "\n".join(stacks_lines(cells))
    assert f"- {old}: 5 runs" in text and f"- {new}: 1 run\n" in text
    assert "5 of these CPU runs do not name their CPU" in text
    assert "do not name" not in "\n".join(stacks_lines([{"stacks": {new: 2}}]))
    assert stacks_lines([{"stacks": {}}]) == []


def test_birth_time_of_a_new_file_is_read_where_the_file_system_keeps_it(tmp_path) -> None:
    log = tmp_path / "run.log"
    log.write_text("x")
    times = wallclock.born_and_modified(log)
    if times is None:
        pytest.skip("this file system keeps no birth times")
    assert times[0] <= times[1] and abs(times[1] - log.stat().st_mtime) < 1


def test_wallclock_without_a_runs_folder_fails_in_one_line(tmp_path, params_dict, monkeypatch) -> None:
    path = write_study(tmp_path, params_dict(None))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["campaign", "wallclock", "--campaign", str(path),
                                      "--from", str(tmp_path / "nowhere")])  # fmt: skip
    assert result.exit_code != 0
    assert result.output.strip().count("\n") == 0 and "has no runs/ folder" in result.output
    assert not (path.parent / wallclock.LEDGER).exists()
