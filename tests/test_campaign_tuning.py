"""Selection off dev: the validation split carved from train, the per-example predictions
every scored run keeps, the base-recipe grid (``campaign tune``) and the ablation seeds."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from paths import at, campaign_at
from rich.console import Console
from typer.testing import CliRunner

from aclpipe.cli import app
from aclpipe.config import params_from_dict
from aclpipe.data.glue_sources import Example
from aclpipe.data.prepared import load_meta, load_split
from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.evaluation.metrics import compute_metrics, task_score
from aclpipe.layout import (
    CAMPAIGN,
    CAMPAIGN_PARAMS,
    CURVES_JSON,
    DVC_YAML,
    METRICS,
    PREDICTIONS,
    RUN_RECORD,
    TRAINING_LOG,
    TRAINING_LOG_PARAMS,
    TUNING_MD,
    VALIDATION,
    Layout,
    split_file,
)
from aclpipe.stages.evaluate import evaluate
from aclpipe.stages.finetune import finetune
from aclpipe.stages.prepare import carve_validation, prepare
from aclpipe.study.campaign.grid import config_name
from aclpipe.study.campaign.markdown import campaign_reports
from aclpipe.study.campaign.plan import load_campaign
from aclpipe.study.campaign.runner import TUNE, commit_command, pending, pending_tuning
from aclpipe.study.campaign.tuning import applied, summarise

SST2 = get_task("sst2")


def examples(labels: list[int]) -> list[Example]:
    return [Example(f"sentence {i}", None, y) for i, y in enumerate(labels)]


# --- the validation split ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 42])
@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5])
def test_validation_is_a_stratified_disjoint_share_of_train(seed: int, fraction: float) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.choice(2, size=203, p=[0.3, 0.7]).tolist()
    pool = examples(labels)
    train, validation = carve_validation(SST2, pool, fraction, seed)
    texts = lambda rows: [e.text_a for e in rows]  # noqa: E731
    assert sorted(texts(train) + texts(validation)) == sorted(texts(pool))  # a partition
    assert not set(texts(train)) & set(texts(validation))
    assert texts(train) == [t for t in texts(pool) if t in set(texts(train))]  # order kept
    counts, held = Counter(labels), Counter(e.label for e in validation)
    for label in (0, 1):  # each class held out in its own share
        assert held[label] == round(fraction * counts[label])
    again = carve_validation(SST2, pool, fraction, seed)
    assert texts(again[1]) == texts(validation)  # fixed by seed
    other = carve_validation(SST2, pool, fraction, seed + 1)
    assert texts(other[1]) != texts(validation)


def test_validation_edge_cases() -> None:
    pool = examples([0, 1, 1, 1])
    assert carve_validation(SST2, pool, 0.0, 1) == (pool, [])  # 0: no validation split
    train, validation = carve_validation(SST2, pool, 0.5, 1)
    assert [e.label for e in train].count(0) == 1  # a class of one stays in train
    assert [e.label for e in validation] == [1, 1]  # round(0.5 * 3)
    stsb = get_task("stsb")
    scored = [Example(f"s{i}", f"t{i}", i / 19 * 5) for i in range(20)]
    train, validation = carve_validation(stsb, scored, 0.2, 3)
    quintiles = Counter(int(e.text_a[1:]) // 4 for e in validation)  # scores rise with i
    assert sorted(quintiles) == [0, 1, 2, 3, 4] and set(quintiles.values()) == {1}  # 0.2 of 4 each


def test_prepare_writes_the_validation_split(tmp_path: Path, params_dict, glue_dir: Path) -> None:
    params = params_from_dict(params_dict(glue_dir, data={"validation_fraction": 0.25}))
    meta = prepare(SST2, params.data, params.model.name, tmp_path / "sst2", glue_dir)
    assert meta["validation_fraction"] == 0.25
    splits = meta["splits"]
    assert splits["train"]["examples"] == 36 and splits["validation"]["examples"] == 12  # of 48
    assert splits["validation"]["labels"] == {"0": 6, "1": 6}  # SST-2's label names
    assert splits["train"]["labels"] == {"0": 18, "1": 18}
    assert len(load_split(tmp_path / "sst2", "train")) == 36
    assert len(load_split(tmp_path / "sst2", "validation")) == 12
    assert len(load_split(tmp_path / "sst2", "dev")) == 16  # dev untouched
    assert load_meta(tmp_path / "sst2")["splits"] == splits
    plain = params_from_dict(params_dict(glue_dir))
    meta = prepare(SST2, plain.data, plain.model.name, tmp_path / "plain", glue_dir)
    assert "validation_fraction" not in meta and "validation" not in meta["splits"]
    assert not split_file(tmp_path / "plain", VALIDATION).exists()


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_validation_fraction_out_of_range_is_one_line(params_dict, value: float) -> None:
    with pytest.raises(UserError, match=r"data.validation_fraction must be in \[0, 1\)"):
        params_from_dict(params_dict(None, data={"validation_fraction": value}))


# --- per-example predictions ------------------------------------------------------------------


def test_evaluate_keeps_every_exit_on_dev_and_validation(
    tmp_path: Path, params_dict, glue_dir: Path
) -> None:
    params = params_from_dict(params_dict(glue_dir, data={"validation_fraction": 0.25}))
    data_dir, model_dir, out = tmp_path / "data", tmp_path / "model", tmp_path / "report"
    prepare(SST2, params.data, params.model.name, data_dir, glue_dir)
    console = Console(file=open(tmp_path / "log.txt", "w"))
    finetune(SST2, "joint", params, data_dir, model_dir, console)
    report = evaluate(SST2, "joint", model_dir, data_dir, out, params.evaluate, "cpu", console)
    saved = np.load(out / PREDICTIONS)
    assert saved["exits"].tolist() == report["exits"] and int(saved["num_layers"]) == 3
    for split, rows in (("dev", 16), ("validation", 12)):
        logits, labels = saved[f"{split}_logits"], saved[f"{split}_labels"]
        assert logits.shape == (3, rows, 2) and logits.dtype == np.float32
        assert labels.tolist() == [r["label"] for r in load_split(data_dir, split)]
        for k, entry in enumerate(report["splits"][split]["per_exit"]):  # the same scores
            metrics = compute_metrics(SST2, logits[k].argmax(-1), labels)
            assert task_score(SST2, metrics) == entry["score"]
    assert report["final_score"] == report["splits"]["dev"]["final_score"]  # dev stays primary
    assert "majority_score" in report["splits"]["validation"]
    curves = json.loads((out / CURVES_JSON).read_text())
    swept = curves["validation"]  # the untimed sweep on validation, where settings are chosen
    assert [(p["policy"], p["threshold"]) for p in swept["points"]] == [
        (p["policy"], p["threshold"]) for p in curves["points"]
    ]
    last = report["splits"]["validation"]["per_exit"][-1]["score"]
    assert swept["full_model"]["score"] == last
    for p in swept["points"]:  # each point from the saved validation logits, the slow way
        chosen = []
        for n in range(12):
            probs = np.exp(saved["validation_logits"][:, n]) / np.exp(
                saved["validation_logits"][:, n]
            ).sum(-1, keepdims=True)
            k = next((k for k in range(3) if p["policy"] == "confidence"
                      and probs[k].max() >= p["threshold"]), None)  # fmt: skip
            chosen.append(k)
        if p["policy"] == "confidence":
            layers = [3 if k is None else k + 1 for k in chosen]
            assert p["mean_exit_layer"] == pytest.approx(sum(layers) / 12)


# --- the tuning grid and the ablation seeds ---------------------------------------------------


def write_spec(folder: Path, base: dict, **spec) -> Path:
    campaign = {"tasks": ["sst2"], "seeds": [1, 2], "runs": ["ce", "joint"], **spec}
    path = folder / CAMPAIGN_PARAMS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**base, "campaign": campaign}), encoding="utf-8")
    return path


GRID = [
    {"train.lr": [1e-3, 1e-2], "train.epochs": [1]},
    {"train.lr": [1e-3], "train.epochs": [2]},
    {"train.lr": [1e-3], "train.epochs": [1]},  # a repeat: one configuration, not two
]


def test_grid_configurations_and_their_overrides(tmp_path: Path, params_dict) -> None:
    base = params_dict(None, data={"validation_fraction": 0.25})
    path = write_spec(
        tmp_path,
        base,
        tune={"method": "ce", "seeds": [3], "grid": GRID},
        task_settings={"sst2": {"data": {"max_length": 16}, "train": {"lr": 5e-5, "epochs": 4}}},
    )
    campaign = load_campaign(path)
    assert list(campaign.tuning.configs) == ["lr0.001_ep1", "lr0.01_ep1", "lr0.001_ep2"]
    assert config_name({"train.warmup_ratio": 0.0, "train.batch_size": 16}) == "bs16_wu0"
    params = campaign.tune_params("sst2", "lr0.01_ep1", 3)
    # the task's data settings apply; its train settings (the recipe being chosen) do not
    assert params.data.max_length == 16 and params.train.lr == 1e-2 and params.train.epochs == 1
    assert params.train.seed == 3
    assert campaign.params("sst2", "ce", 1).train.lr == 5e-5  # the runs use task_settings
    assert pending_tuning(campaign) == [("sst2", c, 3) for c in campaign.tuning.configs]
    folder = campaign.layout.tune_run("sst2", "lr0.01_ep1", 3)
    assert folder == Layout(path.parent).tune_runs("sst2") / "lr0.01_ep1-s3"
    assert commit_command(campaign, [folder], TUNE).endswith(f"{CAMPAIGN}/{DVC_YAML}:tune@sst2")
    with pytest.raises(UserError, match="unknown configuration 'lr9'"):
        campaign.tune_params("sst2", "lr9", 3)


def test_extend_adds_configurations_to_one_task_only(tmp_path: Path, params_dict) -> None:
    extend = {"mrpc": [{"train.lr": [1e-3], "train.epochs": [2, 3]}]}  # lr0.001_ep2: shared
    path = write_spec(
        tmp_path,
        params_dict(None),
        tasks=["sst2", "mrpc"],
        tune={"method": "ce", "seeds": [3], "grid": GRID, "extend": extend},
    )
    campaign = load_campaign(path)
    shared = ["lr0.001_ep1", "lr0.01_ep1", "lr0.001_ep2"]
    assert list(campaign.tuning.configs_for("sst2")) == shared
    assert list(campaign.tuning.configs_for("mrpc")) == [*shared, "lr0.001_ep3"]
    assert campaign.tune_params("mrpc", "lr0.001_ep3", 3).train.epochs == 3
    with pytest.raises(UserError, match="unknown configuration 'lr0.001_ep3'.*sst2"):
        campaign.tune_params("sst2", "lr0.001_ep3", 3)
    jobs = pending_tuning(campaign)
    assert ("mrpc", "lr0.001_ep3", 3) in jobs and ("sst2", "lr0.001_ep3", 3) not in jobs
    assert len(jobs) == 7


@pytest.mark.parametrize(
    ("tune", "message"),
    [
        ({"grid": {"data.max_length": [8]}}, "must be train.<knob>"),
        ({"grid": {"train.lr": []}}, "non-empty list"),
        ({"grid": "lr"}, "grid must map"),
        ({"method": "nope", "grid": {"train.lr": [1e-3]}}, "method 'nope' is unknown"),
        ({"grid": {"train.lr": [-1.0]}}, "train.lr must be > 0"),
        ({"grid": {"train.lr": [1e-3]}, "extra": 1}, "takes method, seeds, grid and extend"),
        ({"grid": {"train.lr": [1e-3]}, "extend": {"rte": {"train.lr": [1.0]}}}, "extend must map"),
        ({"grid": {"train.lr": [1e-3]}, "extend": {"sst2": {"lr": [1.0]}}}, "extend.sst2: key 'lr'"),
        ({"grid": {"train.lr": [1e-3]}, "extend": {"sst2": {"train.lr": [-1.0]}}}, "train.lr must be > 0"),
    ],
)
def test_bad_grids_fail_in_one_line(tmp_path: Path, params_dict, tune, message) -> None:
    path = write_spec(tmp_path, params_dict(None), tune=tune)
    with pytest.raises(UserError, match=message):
        load_campaign(path)


def test_ablations_run_only_their_seeds(tmp_path: Path, params_dict) -> None:
    path = write_spec(
        tmp_path,
        params_dict(None),
        seeds=[1, 2, 3],
        ablations=["acl-nograd"],
        ablation_seeds=[1],
        variants={"acl-nograd": {"method": "acl", "set": {"acl_grad": False}}},
    )
    campaign = load_campaign(path)
    assert campaign.runs == ["ce", "joint", "acl-nograd"] and campaign.seeds_for("acl-nograd") == [1]
    jobs = pending(campaign)
    assert ("sst2", "acl-nograd", 1) in jobs and ("sst2", "acl-nograd", 2) not in jobs
    assert ("sst2", "joint", 3) in jobs and len(jobs) == 7
    with pytest.raises(UserError, match="seed 2 is not in campaign.ablation_seeds"):
        campaign.params("sst2", "acl-nograd", 2)
    folder = campaign.run_dir("sst2", "acl-nograd", 1)
    assert "dvc.yaml:ablation@1-sst2-acl-nograd" in commit_command(campaign, [folder])
    with pytest.raises(UserError, match="campaign.ablations"):
        load_campaign(write_spec(tmp_path, params_dict(None), ablations=["ce"]))


@pytest.mark.slow
def test_tune_end_to_end_picks_on_validation(
    tmp_path: Path, params_dict, glue_dir: Path, monkeypatch
) -> None:
    base = params_dict(glue_dir, data={"validation_fraction": 0.25})
    path = write_spec(tmp_path, base, tune={"seeds": [1], "grid": GRID[:1]})
    monkeypatch.chdir(tmp_path)
    runner, flag = CliRunner(), ["--campaign", CAMPAIGN_PARAMS]
    result = runner.invoke(app, ["campaign", "prepare", "--task", "sst2", *flag])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["campaign", "tune", "--task", "sst2", "--threads", "0", *flag])
    assert result.exit_code == 2 and "--threads 0: give at least 1" in result.output
    result = runner.invoke(app, ["campaign", "tune", "--task", "sst2", "--threads", "1", *flag])
    assert result.exit_code == 0, result.output
    assert "2 runs to do" in result.output and "tune@sst2" in result.output
    campaign = load_campaign(path)
    summary = summarise(campaign, "sst2")
    scores = {}
    for config in ("lr0.001_ep1", "lr0.01_ep1"):
        folder = campaign_at(tmp_path).tune_run("sst2", config, 1)
        metrics = json.loads((folder / METRICS).read_text())
        scores[config] = metrics["splits"]["validation"]["per_exit"][-1]["score"]
        record = json.loads((folder / RUN_RECORD).read_text())
        assert record["method"] == "ce" and record["tuned"]["train.lr"] in (1e-3, 1e-2)
        assert (folder / PREDICTIONS).exists()
    assert summary["pick"] == max(scores, key=scores.get)  # first of ties, like max
    assert not applied(summary)  # task_settings do not hold it yet
    text = (campaign_reports(at(tmp_path).reports(), "sst2") / TUNING_MD).read_text()
    assert "(pick)" in text and "not the pick" in text
    assert [row["forward"] for row in summary["rows"]] == ["padding-free", "padding-free"]
    assert "| padding-free |" in text  # the tiny BERT trains padding-free (auto)
    live = campaign_at(tmp_path).tune_run("sst2", "lr0.001_ep1", 1) / TRAINING_LOG / TRAINING_LOG_PARAMS
    logged = yaml.safe_load(live.read_text())
    live.write_text(yaml.safe_dump({k: v for k, v in logged.items() if k != "padding_free"}))
    rows = summarise(campaign, "sst2")["rows"]  # a run from before the knob: padded
    assert [row["forward"] for row in rows] == ["padded", "padding-free"]
    live.write_text(yaml.safe_dump(logged))
    knobs = summary["pick_knobs"]
    write_spec(
        tmp_path,
        base,
        tune={"seeds": [1], "grid": GRID[:1]},
        task_settings={"sst2": {"train": {k.split(".")[1]: v for k, v in knobs.items()}}},
    )
    assert applied(summarise(load_campaign(path), "sst2"))
    result = runner.invoke(app, ["campaign", "tune", "--task", "sst2", *flag])
    assert result.exit_code == 0 and "0 runs to do" in result.output  # nothing is redone
    assert "uses the pick" in (campaign_reports(at(tmp_path).reports(), "sst2") / TUNING_MD).read_text()


def write_tune_run(campaign, config: str, seed: int, right: np.ndarray, labels: np.ndarray,
                   predictions: bool = True, data: dict | None = None) -> None:  # fmt: skip
    """A finished grid run whose final exit is right on validation where ``right`` is."""
    folder = campaign.layout.tune_run("sst2", config, seed)
    (folder / TRAINING_LOG).mkdir(parents=True)
    final = np.where(right, labels, 1 - labels)
    logits = np.zeros((1, len(labels), 2), dtype=np.float32)
    logits[0, np.arange(len(labels)), final] = 1.0
    score = float(np.mean(right))
    split = {"per_exit": [{"layer": 2, "score": score}]}
    (folder / METRICS).write_text(json.dumps({"splits": {"dev": split,
                                                                "validation": split}}))  # fmt: skip
    (folder / RUN_RECORD).write_text(json.dumps({"data": data or {"max_length": 64}}))
    (folder / TRAINING_LOG / TRAINING_LOG_PARAMS).write_text("padding_free: true\n")
    if predictions:
        np.savez_compressed(folder / PREDICTIONS, validation_logits=logits,
                            validation_labels=labels)  # fmt: skip


def test_the_pick_is_tested_against_the_runner_up(tmp_path: Path, params_dict) -> None:
    from aclpipe.study.campaign.tuning import markdown

    grid = [{"train.lr": [1e-3, 1e-2, 1e-1], "train.epochs": [1]}]
    campaign = load_campaign(write_spec(tmp_path, params_dict(None),
                                        tune={"seeds": [1], "grid": grid}))  # fmt: skip
    n = 60
    labels = np.arange(n) % 2
    rng = np.random.default_rng(7)
    pick = rng.random(n) < 0.8
    runner_up = pick.copy()
    runner_up[np.flatnonzero(pick)[:3]] = False  # 3 examples fewer right: 5 points behind
    write_tune_run(campaign, "lr0.001_ep1", 1, pick, labels)
    write_tune_run(campaign, "lr0.01_ep1", 1, runner_up, labels)
    write_tune_run(campaign, "lr0.1_ep1", 1, np.zeros(n, dtype=bool), labels)
    summary = summarise(campaign, "sst2")
    found = summary["margin"]
    assert summary["pick"] == "lr0.001_ep1" and found["runner_up"] == "lr0.01_ep1"
    assert found["difference"] == pytest.approx(3 / n)
    # a plain reference: resample the examples (the same draws), count who is right
    draws = np.random.default_rng(0).integers(0, n, (2000, n))
    diffs = np.sort([(pick[d].sum() - runner_up[d].sum()) / n for d in draws])
    low, high = np.quantile(diffs, [0.025, 0.975])
    assert (found["low"], found["high"]) == pytest.approx((low, high))
    assert found["p"] == pytest.approx(np.mean(diffs <= 1e-12))
    # the runner-up is only ever worse or equal: the interval cannot go below 0
    assert found["low"] >= 0 and found["verdict"] == ("better" if low > 1e-12 else
                                                      "no detectable difference")  # fmt: skip
    text = markdown(summary)
    assert "The pick against the runner-up (lr0.01_ep1) on validation: +5.00 [" in text
    assert "one tuning seed" in text


def test_a_pick_other_than_the_recipe_in_use_is_tested_against_it(
    tmp_path: Path, params_dict
) -> None:
    """An extended grid can pick another recipe than the one the campaign's runs use: the
    report names both and compares them, besides the runner-up."""
    from aclpipe.study.campaign.tuning import applied, markdown

    grid = [{"train.lr": [1e-3, 1e-2, 1e-1], "train.epochs": [1]}]
    path = write_spec(tmp_path, params_dict(None), tune={"seeds": [1], "grid": grid},
                      task_settings={"sst2": {"train": {"lr": 1e-1, "epochs": 1}}})  # fmt: skip
    campaign = load_campaign(path)
    n = 50
    labels = np.arange(n) % 2
    pick = np.arange(n) < 45  # 90%
    write_tune_run(campaign, "lr0.001_ep1", 1, pick, labels)
    write_tune_run(campaign, "lr0.01_ep1", 1, np.arange(n) < 44, labels)  # runner-up, 88%
    write_tune_run(campaign, "lr0.1_ep1", 1, np.arange(n) < 30, labels)  # in use, 60%
    summary = summarise(campaign, "sst2")
    assert not applied(summary) and summary["margin"]["runner_up"] == "lr0.01_ep1"
    found = summary["against_in_use"]
    assert found["runner_up"] == "lr0.1_ep1" and found["difference"] == pytest.approx(15 / n)
    assert found["verdict"] == "better"
    text = markdown(summary)
    assert "is not the pick: the campaign's runs use `{lr: 0.1, epochs: 1}`" in text
    assert "To use the pick, set it to `{lr: 0.001, epochs: 1}`" in text
    from aclpipe.study.campaign.overview import recipe_lines

    (line,) = recipe_lines({"sst2": summary}, ["sst2"])  # reports/README.md's, same numbers
    assert "sst2 lr 0.1, epochs 1 (not the grid's pick, lr0.001_ep1, +30.00 [" in line
    assert "points over it on validation: better)" in line
    assert "the campaign's runs use (lr0.1_ep1) on validation: +30.00 [" in text
    # the runner-up in use: one comparison, not the same one twice
    write_spec(tmp_path, params_dict(None), tune={"seeds": [1], "grid": grid},
               task_settings={"sst2": {"train": {"lr": 1e-2, "epochs": 1}}})  # fmt: skip
    text = markdown(summarise(load_campaign(path), "sst2"))
    assert text.count("The pick against") == 1
    write_spec(tmp_path, params_dict(None), tune={"seeds": [1], "grid": grid},
               task_settings={"sst2": {"train": {"lr": 1e-3, "epochs": 1}}})  # fmt: skip
    assert recipe_lines({"sst2": summarise(load_campaign(path), "sst2")}, ["sst2", "rte"]) == [
        "The base recipe each task's runs use, tuned on ce's validation score with one seed "
        "(campaign/<task>/tuning.md): sst2 lr 0.001, epochs 1 (the pick)."
    ]


def test_a_tie_on_validation_is_no_detectable_difference(tmp_path: Path, params_dict) -> None:
    from aclpipe.study.campaign.tuning import markdown

    grid = [{"train.lr": [1e-3, 1e-2], "train.epochs": [1]}]
    campaign = load_campaign(write_spec(tmp_path, params_dict(None),
                                        tune={"seeds": [1, 2], "grid": grid}))  # fmt: skip
    labels = np.arange(40) % 2
    for seed in (1, 2):
        right = np.random.default_rng(seed).random(40) < 0.7
        for config in ("lr0.001_ep1", "lr0.01_ep1"):
            write_tune_run(campaign, config, seed, right, labels)
    summary = summarise(campaign, "sst2")
    found = summary["margin"]
    assert summary["pick"] == "lr0.001_ep1"  # ties: the first listed
    assert (found["difference"], found["low"], found["high"]) == (0.0, 0.0, 0.0)
    assert found["seeds"] == [1, 2] and found["verdict"] == "no detectable difference"
    text = markdown(summary)
    assert "and tuning seeds" in text and "does not tell these two recipes apart" in text


def test_a_grid_without_predictions_has_no_margin(tmp_path: Path, params_dict) -> None:
    from aclpipe.study.campaign.tuning import markdown

    grid = [{"train.lr": [1e-3, 1e-2], "train.epochs": [1]}]
    campaign = load_campaign(write_spec(tmp_path, params_dict(None),
                                        tune={"seeds": [1], "grid": grid}))  # fmt: skip
    labels = np.arange(20) % 2
    write_tune_run(campaign, "lr0.001_ep1", 1, labels == 0, labels, predictions=False)
    write_tune_run(campaign, "lr0.01_ep1", 1, labels == 1, labels)
    summary = summarise(campaign, "sst2")
    assert summary["margin"] is None and "runner-up" not in markdown(summary)
    only = load_campaign(write_spec(tmp_path, params_dict(None),
                                    tune={"seeds": [1], "grid": [grid[0] | {"train.lr": [1e-3]}]}))  # fmt: skip
    assert summarise(only, "sst2")["margin"] is None  # one configuration: no runner-up


@pytest.mark.parametrize("odd", ["order", "data"])
def test_a_margin_over_other_examples_is_a_one_line_error(tmp_path: Path, params_dict,
                                                          odd: str) -> None:  # fmt: skip
    """The pick and the runner-up are compared example by example: a run scored on other
    validation examples (another order) or prepared otherwise (another max_length) stops
    the tuning report with one line naming it and the command that redoes the grid."""
    grid = [{"train.lr": [1e-3, 1e-2], "train.epochs": [1]}]
    path = write_spec(tmp_path, params_dict(None), tune={"seeds": [1], "grid": grid})
    campaign = load_campaign(path)
    labels = np.arange(30) % 2
    write_tune_run(campaign, "lr0.001_ep1", 1, np.ones(30, dtype=bool), labels)
    if odd == "order":
        write_tune_run(campaign, "lr0.01_ep1", 1, labels == 1, labels[::-1].copy())
        message = "scored other validation examples than"
    else:
        write_tune_run(campaign, "lr0.01_ep1", 1, labels == 1, labels, data={"max_length": 128})
        message = r"was trained on other data than .* differs in max_length\)"
    with pytest.raises(UserError, match=message + ".*aclpipe campaign tune --task sst2$"):
        summarise(campaign, "sst2")


def test_a_pick_at_the_grid_edge_is_named_and_one_seed_is_said() -> None:
    """The pick's knob at the largest or smallest value the grid tried is named; a knob the
    grid does not vary, or a middle value, is not; one tuning seed is said to separate
    nothing."""
    from aclpipe.study.campaign.tuning import edges, markdown

    def row(config, lr, epochs):
        return {"config": config, "knobs": {"train.lr": lr, "train.epochs": epochs,
                                            "train.batch_size": 32},
                "seeds": [1], "forward": "padded", "validation": 0.8, "dev": 0.79}  # fmt: skip

    rows = [row("a", 2e-5, 3), row("b", 5e-5, 5), row("c", 1e-4, 3)]
    summary = {"task": "mrpc", "method": "ce", "seeds": [1], "rows": rows, "pick": "b",
               "pick_knobs": rows[1]["knobs"], "in_use": rows[1]["knobs"], "complete": True,
               "margin": None}  # fmt: skip
    assert edges(summary) == [("train.epochs", 5, "largest")]
    text = markdown(summary)
    assert "The pick lies at the grid's edge in train.epochs (5, the largest tried)" in text
    assert "One tuning seed cannot separate the top picks" in text
    assert edges({**summary, "pick": "a"}) == [("train.lr", 2e-5, "smallest"),
                                               ("train.epochs", 3, "smallest")]
    assert "cannot separate" not in markdown({**summary, "seeds": [1, 2]})


def test_knobs_text_drops_the_section_and_formats_numbers_once() -> None:
    from aclpipe.study.campaign.tuning import knobs_text

    knobs = {"train.lr": 5e-5, "train.epochs": 8, "train.padding_free": True, "model.pooling": "mean"}
    assert knobs_text(knobs) == "lr 5e-05, epochs 8, padding_free True, pooling mean"
    assert knobs_text({"train.lr": 0.1}, ": ") == "lr: 0.1"
    assert knobs_text({}) == ""
