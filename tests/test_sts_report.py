"""The STS study's report (``aclpipe sts report``): claim L2's verdicts on hand-made cosines
whose answer is known, the family over the 4 claims, the checkpoint as context, the report
rebuilt byte-identical from the same runs, and partial data (1 seed, missing poolings).

Runs are built in memory or written as ``sts/runs/`` folders of cosines; no model runs. The
bootstrap uses 400 resamples (``Rules`` directly; sts/params.yaml asks for 10,000).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from aclpipe.errors import UserError
from aclpipe.study.stats import paired
from aclpipe.study.stats.verdicts import Rules
from aclpipe.study.sts.markdown import render_readme, summary_paragraph
from aclpipe.study.sts.report import (
    FIGURE,
    README,
    RESULTS,
    SpearmanCache,
    summarise,
    weighted_spearman,
    write_report,
)
from aclpipe.study.sts.study import COSINES, RUN_RECORD, Objective, StsStudy, load_study

RULES = Rules(resamples=400)  # margin 1 point, as sts/params.yaml
POOLINGS = ["cls", "mean", "layer-attention"]
PAIRS = 200
SPLITS = ("dev", "test")


def make_study(root: Path, objectives=("unsup",), seeds=(1, 2, 3)) -> StsStudy:
    methods = {"unsup": Objective("simcse-unsup", "sentences"),
               "sup": Objective("simcse-sup", "sentence-pairs")}  # fmt: skip
    return StsStudy({}, {o: methods[o] for o in objectives}, list(POOLINGS), list(seeds),
                    root=root / "sts", verdicts=RULES)  # fmt: skip


def gold_scores(pairs: int = PAIRS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {s: np.round(rng.uniform(0, 5, pairs), 1) for s in SPLITS}  # ties, as STS has


def zero_shot(gold: dict) -> dict:
    """The checkpoint: 3 poolings x 2 layers of noise, except mean at the last layer, which
    tracks the gold scores as a trained run does (all-MiniLM's published pooling)."""
    rng = np.random.default_rng(1)
    cosines = {f"gold_{s}": g for s, g in gold.items()}
    for s, g in gold.items():
        layers = rng.normal(size=(3, 2, len(g)))
        layers[1, -1] = g + rng.normal(scale=0.5, size=len(g))
        cosines[f"layers_{s}"] = layers
    return {"record": {"model": "tiny"}, "cosines": cosines}


def a_run(gold: dict, trained: dict) -> tuple[dict, dict]:
    """``(record, cosines)`` of one seed: its trained cosines per split."""
    layers = {f"layers_{s}": np.zeros((3, 2, len(g))) for s, g in gold.items()}
    golds = {f"gold_{s}": g for s, g in gold.items()}
    trained = {f"trained_{s}": c for s, c in trained.items()}
    return {"train_seconds": 1.0}, {**trained, **layers, **golds}


def noisy(gold: dict, scale: float, rng) -> dict:
    return {s: g + rng.normal(scale=scale, size=len(g)) for s, g in gold.items()}


def runs_of(study: StsStudy, gold: dict, noise: dict[str, float], seed: int = 0) -> dict:
    """Every objective, pooling and seed of the study: gold + noise of the pooling's scale
    (cls, when not given, as noisy as mean)."""
    rng = np.random.default_rng(seed)
    runs: dict = {}
    for objective in study.objectives:
        for pooling in study.poolings:
            scale = noise.get(pooling, noise["mean"])
            for s in study.seeds:
                runs.setdefault((objective, pooling), {})[s] = a_run(gold, noisy(gold, scale, rng))
    return runs


def test_the_cache_gives_the_bits_of_weighted_spearman() -> None:
    """Cached Spearmans (gold's ranks kept for the draw) equal the uncached ones bit for bit,
    for a second run under the same draw and after a draw of another size."""
    gold = gold_scores(50)["test"]
    rng = np.random.default_rng(3)
    runs = [gold + rng.normal(size=50) for _ in range(2)]
    cache = SpearmanCache()
    for seeds in (3, 1, 3):
        weights, _ = paired.draw(50, seeds, 300)
        for run in runs:
            got = cache.spearman(run, gold, weights)
            assert np.array_equal(got, weighted_spearman(run, gold, weights))
            assert cache.spearman(run, gold, weights) is got


# Each verdict on cosines whose answer is known -----------------------------------------------


@pytest.mark.parametrize(
    ("la_noise", "base_noise", "verdict"),
    [(0.3, 3.0, "better"), (3.0, 0.3, "worse")],
)
def test_a_clear_difference_is_better_or_worse(
    tmp_path: Path, la_noise: float, base_noise: float, verdict: str
) -> None:
    study, gold = make_study(tmp_path), gold_scores()
    runs = runs_of(study, gold, {"layer-attention": la_noise, "mean": base_noise})
    summary = summarise(study, runs, zero_shot(gold))
    for split in SPLITS:
        for claim in summary["splits"][split]["claims"]:
            assert claim["verdict"] == verdict and claim["seeds"] == [1, 2, 3]
            assert claim["p"] == pytest.approx(1 / 401)  # no resample on the wrong side
    claim = summary["splits"]["test"]["claims"][0]
    assert claim["claim"] == "unsup: layer-attention beats mean" and claim["kind"] == "superiority"
    want = np.mean([
        stats.spearmanr(runs[("unsup", "layer-attention")][s][1]["trained_test"], gold["test"])[0]
        - stats.spearmanr(runs[("unsup", "mean")][s][1]["trained_test"], gold["test"])[0]
        for s in (1, 2, 3)
    ])  # fmt: skip
    assert claim["difference"] == pytest.approx(want, abs=1e-12)
    run = summary["splits"]["test"]["runs"]["unsup/layer-attention"]
    assert run["mean"] == pytest.approx(np.mean(
        [stats.spearmanr(runs[("unsup", "layer-attention")][s][1]["trained_test"], gold["test"])[0]
         for s in (1, 2, 3)]
    ))  # fmt: skip
    assert claim["holds"] is (verdict == "better")


def test_identical_runs_are_comparable(tmp_path: Path) -> None:
    """Layer-attention's cosines equal to mean's and cls's, seed by seed: every resampled
    difference is 0, so non-inferiority at the 1-point margin passes and superiority does
    not: comparable, and the claim (it improves) does not hold."""
    study, gold = make_study(tmp_path), gold_scores()
    runs = runs_of(study, gold, {"mean": 1.0})
    for s in study.seeds:
        runs[("unsup", "layer-attention")][s] = runs[("unsup", "mean")][s]
        runs[("unsup", "cls")][s] = runs[("unsup", "mean")][s]
    summary = summarise(study, runs, zero_shot(gold))
    for claim in summary["splits"]["test"]["claims"]:
        assert claim["verdict"] == "comparable" and not claim["holds"]
        assert claim["difference"] == claim["low"] == claim["high"] == 0.0
        assert claim["p"] == claim["p_comparable"] == pytest.approx(1 / 401)
        assert claim["p_better"] == claim["p_worse"] == 1.0
    text = summary_paragraph(summary)
    assert "does not hold but is comparable" in text and "holds family-wise" not in text


def test_noisy_runs_are_inconclusive_with_a_detectable_size(tmp_path: Path) -> None:
    """40 pairs, every pooling as noisy as the next: the interval reaches past -1 and +1
    point, so no verdict passes; it reads "no difference larger than x points"."""
    study, gold = make_study(tmp_path), gold_scores(40)
    runs = runs_of(study, gold, {"layer-attention": 2.0, "mean": 2.0})
    summary = summarise(study, runs, zero_shot(gold))
    claim = summary["splits"]["test"]["claims"][0]
    assert claim["verdict"] == "inconclusive" and not claim["holds"]
    assert claim["low"] < -0.01 < 0.01 < claim["high"]
    assert claim["detectable"] == max(-claim["low"], claim["high"])
    assert claim["p"] == claim["p_better"] > 0.025  # the claim's own test: superiority
    readme = render_readme(study, summary, {}, FIGURE)
    detectable = f"no difference larger than {100 * claim['detectable']:.2f} points"
    assert detectable in readme and detectable in summary_paragraph(summary)


# The family, and the context outside it --------------------------------------------------------


def test_the_family_is_the_four_claims_on_test(tmp_path: Path) -> None:
    """Two objectives x 2 claims on test are one family: each Holm p is Holm's step-down over
    the 4 printed p's; dev's claims and the checkpoint comparisons carry none."""
    study, gold = make_study(tmp_path, ("unsup", "sup")), gold_scores(60)
    runs = runs_of(study, gold, {"layer-attention": 0.8, "mean": 1.2, "cls": 3.0})
    summary = summarise(study, runs, zero_shot(gold))
    claims = summary["splits"]["test"]["claims"]
    assert [c["claim"] for c in claims] == [
        "unsup: layer-attention beats mean", "unsup: layer-attention beats cls",
        "sup: layer-attention beats mean", "sup: layer-attention beats cls",
    ]  # fmt: skip
    assert summary["family"] == 4
    assert [c["holm_p"] for c in claims] == pytest.approx(paired.holm([c["p"] for c in claims]))
    assert all(c["holm_mc_error"] > 0 for c in claims)
    for c in claims:
        decided = c["verdict"] in ("better", "worse", "comparable")
        assert c["family_wise"] == (decided and c["holm_p"] <= 0.025)
    assert {c["verdict"] for c in claims if "cls" in c["claim"]} == {"better"}
    assert not any("holm_p" in c for c in summary["splits"]["dev"]["claims"])
    context = summary["splits"]["test"]["context"]
    assert not any("holm_p" in c for c in context)
    # 6 trained settings, each against its same pooling and the published mean (a mean run once)
    assert len(context) == 2 * 3 * 2 - 2
    mean_run = [c for c in context if c["a"] == "unsup/mean"]
    assert len(mean_run) == 1 and mean_run[0]["same_pooling"] and mean_run[0]["published"]
    readme = render_readme(study, summary, {}, FIGURE)
    assert "## Context, not claims: trained runs against the untrained checkpoint" in readme
    assert "Family-wise (Holm over the 4 claims judged on the STS Benchmark test" in readme
    text = summary_paragraph(summary)
    assert text.startswith("All 18 planned runs are present.")
    held = text.split("holds family-wise for ")[1].split("; it ")[0]
    names = [c["claim"] for c in claims]
    assert [n for n in names if f"; {n} (" in f"; {held}"] == [
        c["claim"] for c in claims if c["verdict"] == "better" and c["family_wise"]
    ]


def test_training_against_the_checkpoint_mean_is_said_as_judged(tmp_path: Path) -> None:
    """The checkpoint's mean pooling (noise 0.5) against trained runs with less noise (better)
    and more (worse): the summary says which, and that training beat it where better."""
    study, gold = make_study(tmp_path), gold_scores()
    runs = runs_of(study, gold, {"layer-attention": 0.1, "mean": 3.0})
    summary = summarise(study, runs, zero_shot(gold))
    published = {
        c["a"]: c["verdict"] for c in summary["splits"]["test"]["context"] if c["published"]
    }
    assert published == {"unsup/cls": "worse", "unsup/mean": "worse",
                         "unsup/layer-attention": "better"}  # fmt: skip
    text = summary_paragraph(summary)
    assert "training beat it in 1 of the 3 trained settings there" in text
    assert "better for unsup/layer-attention" in text and "worse for unsup/cls" in text


# The report on disk: deterministic, and honest about partial data -------------------------------


def write_runs(study: StsStudy, gold: dict, runs: dict) -> None:
    def save(folder: Path, record: dict, arrays: dict) -> None:
        folder.mkdir(parents=True)
        (folder / RUN_RECORD).write_text(json.dumps(record), encoding="utf-8")
        np.savez(folder / COSINES, **arrays)

    zero = zero_shot(gold)
    save(study.zero_shot_dir(), zero["record"], zero["cosines"])
    for (objective, pooling), seeds in runs.items():
        for seed, (record, cosines) in seeds.items():
            save(study.run_dir(objective, pooling, seed), record, cosines)


@pytest.mark.slow
def test_the_report_rebuilds_byte_identical(tmp_path: Path) -> None:
    study, gold = make_study(tmp_path), gold_scores(60)
    write_runs(study, gold, runs_of(study, gold, {"layer-attention": 0.8, "mean": 1.5}))
    first = write_report(study, tmp_path / "first")
    again = write_report(study, tmp_path / "again")
    for name in (README, RESULTS, FIGURE):
        assert (first.parent / name).read_bytes() == (again.parent / name).read_bytes(), name
    results = json.loads((first.parent / RESULTS).read_text(encoding="utf-8"))
    assert results["rules"] == {"margin": 0.01, "resamples": 400, "alpha": 0.025}
    readme = first.read_text(encoding="utf-8")
    for claim in results["splits"]["test"]["claims"]:  # every number shown is in results.json
        assert f"{100 * claim['difference']:+.2f} [" in readme
        assert f"{claim['p']:.4f} ± {claim['mc_error']:.4f}" in readme
        assert f"{claim['holm_p']:.4f} ± {claim['holm_mc_error']:.4f}" in readme


@pytest.mark.slow
def test_partial_data_one_seed_and_missing_poolings(tmp_path: Path) -> None:
    """3 of 18 runs plus a disjoint pair: unsup's layer-attention and mean at seed 1 (1 seed:
    sentence pairs only), sup's layer-attention at seeds 1-2 and cls at seed 3 (no common
    seed), no cls for unsup, no mean for sup."""
    study, gold = make_study(tmp_path, ("unsup", "sup")), gold_scores(60)
    rng = np.random.default_rng(2)
    runs = {
        ("unsup", "layer-attention"): {1: a_run(gold, noisy(gold, 0.3, rng))},
        ("unsup", "mean"): {1: a_run(gold, noisy(gold, 3.0, rng))},
        ("sup", "layer-attention"): {s: a_run(gold, noisy(gold, 0.3, rng)) for s in (1, 2)},
        ("sup", "cls"): {3: a_run(gold, noisy(gold, 3.0, rng))},
    }
    write_runs(study, gold, runs)
    readme = write_report(study, tmp_path / "reports").read_text(encoding="utf-8")
    results = json.loads((tmp_path / "reports" / RESULTS).read_text(encoding="utf-8"))
    assert results["runs_present"] == 5 and results["runs_planned"] == 18
    missing = results["missing"]
    assert missing["unsup/cls"] == missing["sup/mean"] == [1, 2, 3] and missing["sup/cls"] == [1, 2]
    by_name = {c["claim"]: c for c in results["splits"]["test"]["claims"]}
    judged = by_name["unsup: layer-attention beats mean"]
    assert judged["seeds"] == [1] and judged["verdict"] == "better" and results["family"] == 1
    assert judged["holm_p"] == judged["p"]  # a family of one
    assert by_name["unsup: layer-attention beats cls"]["verdict"] == "not run yet"
    assert by_name["sup: layer-attention beats mean"]["missing"] == ["sup/mean"]
    assert by_name["sup: layer-attention beats cls"]["verdict"] == "no common seed"
    assert "holm_p" not in by_name["sup: layer-attention beats cls"]
    summary = readme.split("## Summary\n\n")[1].split("\n")[0]
    assert summary.startswith("Partial data: 5 of 18 planned runs are present")
    assert "unsup/layer-attention 1 of 3 seeds" in summary
    assert "holds family-wise for unsup: layer-attention beats mean (" in summary
    assert "1 seed: sentence pairs only" in summary and "2 seeds only" in summary
    assert "Not judged yet: unsup: layer-attention beats cls (not run yet: unsup/cls)" in summary
    assert "sup: layer-attention beats cls (no common seed)" in summary
    assert "| unsup | cls | 0 | not run | not run |  |" in readme
    assert "| 1 (1 seed: sentence pairs only) |" in readme
    assert (tmp_path / "reports" / FIGURE).stat().st_size > 0


def test_runs_that_scored_other_pairs_are_refused(tmp_path: Path) -> None:
    study, gold = make_study(tmp_path, seeds=(1,)), gold_scores(20)
    other = {s: g[::-1].copy() for s, g in gold.items()}
    write_runs(study, gold, {("unsup", "mean"): {1: a_run(other, other)}})
    with pytest.raises(UserError, match="unsup-mean-s1 scored other test examples"):
        write_report(study, tmp_path / "reports")
    assert not (tmp_path / "reports").exists()


# The rules, read from sts/params.yaml ----------------------------------------------------------


def test_the_verdict_rules_come_from_sts_params(tmp_path: Path) -> None:
    study = load_study(Path(__file__).resolve().parents[1] / "sts" / "params.yaml")
    assert study.verdicts == Rules(margin=0.01, resamples=10000)
    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "sts" / "params.yaml").read_text())
    path = tmp_path / "params.yaml"
    for verdicts, error in (
        ({"margin": 1.0, "resamples": 10000, "rule_floor": 0.01}, "must be {margin"),
        ({"margin": 1.0, "resamples": 500}, "at least 2000"),
        ({"margin": 1.0, "tails": 2}, "unknown key tails"),
    ):
        raw["sts"]["verdicts"] = verdicts
        path.write_text(yaml.safe_dump(raw), encoding="utf-8")
        with pytest.raises(UserError, match=error):
            load_study(path)
    raw["sts"].pop("verdicts")
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert load_study(path).verdicts == Rules()
