"""The few-shot study's cells beside its grid, and its peers (linear probe, SetFit) as runs of
the study on the tiny model, against a plain scikit-learn reference written here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cli_helpers
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from aclpipe.cli import app
from aclpipe.errors import UserError
from aclpipe.study.campaign.plan import load_campaign
from aclpipe.study.campaign.runner import pending

ROOT = Path(__file__).resolve().parents[1]
GRID = {
    "tasks": ["sst2", "mrpc"],
    "seeds": [1, 2],
    "runs": ["ce"],
    "fewshot": [4, 8],
    "fewshot_settings": {4: {"train": {"epochs": 2}}, 8: {"train": {"epochs": 1}}},
}


def write_study(folder: Path, base: dict, **spec) -> Path:
    return cli_helpers.write_study(folder, base, GRID, **spec)


CELLS = {
    "peers": {"runs": ["linear-probe"], "tasks": ["sst2"], "fewshot": [4, 6], "seeds": [1, 2]},
    "draws": {"runs": ["ce"], "tasks": ["sst2"], "fewshot": [4], "seeds": [3, 4, 5]},
}


def test_cells_add_runs_beside_the_grid_and_leave_its_runs_as_they_were(
    tmp_path, params_dict
) -> None:
    grid = load_campaign(write_study(tmp_path / "a", params_dict(None)))
    study = load_campaign(write_study(
        tmp_path / "b", params_dict(None), cells=CELLS, fewshot_settings={**GRID["fewshot_settings"], 6: {"train": {"epochs": 3}}}
    ))  # fmt: skip
    for task in grid.tasks:  # the grid's runs: the same params, overrides and stages
        for run in grid.runs:
            for seed in grid.seeds:
                assert study.raw_params(task, run, seed) == grid.raw_params(task, run, seed)
                assert study.stage(task, run, seed) == grid.stage(task, run, seed)
    assert study.fewshot == [4, 6, 8]
    assert study.runs == ["ce-n4", "linear-probe-n4", "linear-probe-n6", "ce-n8"]
    assert study.seeds_at("sst2", "ce-n4") == [1, 2, 3, 4, 5]
    assert (
        study.seeds_at("mrpc", "ce-n4") == [1, 2]
        and study.seeds_at("mrpc", "linear-probe-n6") == []
    )
    assert study.stage("sst2", "ce-n4", 4) == "draws@4-sst2-4-ce"
    assert study.stage("sst2", "linear-probe-n6", 2) == "peers@2-sst2-6-linear-probe"
    assert study.params("sst2", "linear-probe-n6", 2).train.epochs == 3
    assert study.draws_on("mrpc") == [1, 2] and study.draws_on("sst2") == [1, 2, 3, 4, 5]
    with pytest.raises(UserError, match="seed 3 is not in"):
        study.overrides("mrpc", "ce-n4", 3)  # planned on sst2 only
    jobs = pending(study)  # every planned run once, N by N
    expected = 2 * 2 * 2 + 2 * 2 + 3
    assert len(jobs) == len(set(jobs)) == expected
    assert [study.fewshot_runs[r][1] for _, r, _ in jobs] == sorted(
        study.fewshot_runs[r][1] for _, r, _ in jobs
    )
    assert pending(study, runs=["linear-probe"]) == [
        ("sst2", "linear-probe-n4", 1), ("sst2", "linear-probe-n4", 2),
        ("sst2", "linear-probe-n6", 1), ("sst2", "linear-probe-n6", 2),
    ]  # fmt: skip
    assert pending(study, runs=["ce-n8"], tasks=["mrpc"]) == [
        ("mrpc", "ce-n8", 1),
        ("mrpc", "ce-n8", 2),
    ]


@pytest.mark.parametrize(
    ("cells", "message"),
    [({"run": {"runs": ["ce"], "tasks": ["sst2"], "fewshot": [4], "seeds": [3]}}, "not 'run'"),
     ({"x": {"runs": ["ce"], "tasks": ["sst2"], "fewshot": [4]}}, "four lists"),
     ({"x": {"runs": ["ce"], "tasks": ["rte"], "fewshot": [4], "seeds": [3]}}, "tasks of campaign.tasks"),
     ({"x": {"runs": ["ce"], "tasks": ["sst2"], "fewshot": [8, 4], "seeds": [3]}}, "ascending"),
     ({"x": {"runs": ["ce"], "tasks": ["sst2"], "fewshot": [4], "seeds": [2]}}, "planned by both run and x"),
     ({"x": {"runs": ["nope"], "tasks": ["sst2"], "fewshot": [4], "seeds": [3]}}, "neither a method")],
)  # fmt: skip
def test_bad_cells_fail_in_one_line(tmp_path, params_dict, cells, message) -> None:
    with pytest.raises(UserError, match=message):
        load_campaign(write_study(tmp_path, params_dict(None), cells=cells))


def test_bad_peer_knobs_fail_in_one_line(tmp_path, params_dict) -> None:
    with pytest.raises(UserError, match="linear-probe has no knob 'c'"):
        load_campaign(write_study(tmp_path, params_dict(None), peers={"linear-probe": {"c": 2}}))


def reference_probe(model_dir: Path, rows_train, rows_dev, pooling: str, C: float) -> np.ndarray:
    """One example at a time, no padding: the frozen encoder's pooled last layer, then a
    logistic regression; its log-probabilities on dev."""
    from sklearn.linear_model import LogisticRegression
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(str(model_dir)).eval()

    def pooled(row) -> np.ndarray:
        ids = torch.tensor([row["input_ids"]])
        types = torch.tensor([row.get("token_type_ids", [0] * len(row["input_ids"]))])
        with torch.no_grad():
            hidden = encoder(input_ids=ids, token_type_ids=types).last_hidden_state[0]  # [T, H]
        return (hidden.mean(0) if pooling == "mean" else hidden[0]).numpy()

    x = np.stack([pooled(r) for r in rows_train])
    head = LogisticRegression(C=C, max_iter=1000).fit(x, [r["label"] for r in rows_train])
    return head.predict_log_proba(np.stack([pooled(r) for r in rows_dev]))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pooling", "C", "task"), [("mean", 1.0, "sst2"), ("cls", 0.1, "sst2"), ("mean", 10.0, "mrpc")]
)
def test_linear_probe_run_matches_a_plain_scikit_learn_probe(
    tmp_path, params_dict, glue_dir, tiny_model_dir, monkeypatch, pooling, C, task
) -> None:
    from aclpipe.data.prepared import load_split

    base = params_dict(glue_dir)
    base["model"]["pooling"] = pooling
    cells = {"peers": {"runs": ["linear-probe"], "tasks": [task], "fewshot": [8], "seeds": [1]}}
    write_study(tmp_path, base, tasks=[task], cells=cells, peers={"linear-probe": {"C": C}})
    monkeypatch.chdir(tmp_path)
    runner, flag = CliRunner(), ["--campaign", "fewshot/params.yaml"]
    result = runner.invoke(app, ["campaign", "prepare", "--task", task, "--seed", "1", *flag])
    assert result.exit_code == 0, result.output
    args = ["campaign", "run", "--task", task, "--run", "linear-probe-n8", "--seed", "1", *flag]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    folder, data = (
        tmp_path / f"fewshot/runs/{task}/linear-probe-n8-s1",
        tmp_path / f"fewshot/data/{task}/s1/n8",
    )
    npz = np.load(folder / "predictions.npz")
    expected = reference_probe(
        tiny_model_dir, load_split(data, "train"), load_split(data, "dev"), pooling, C
    )
    assert npz["dev_logits"].shape == (1, *expected.shape)
    np.testing.assert_allclose(npz["dev_logits"][0], expected, atol=1e-4)
    record = json.loads((folder / "run.json").read_text())
    assert record["peer"]["recipe"]["C"] == C and record["peer"]["recipe"]["pooling"] == pooling
    assert record["data"]["fewshot"]["examples"] == 8 and record["method"] == "linear-probe"
    metrics = json.loads((folder / "metrics.json").read_text())
    right = (expected.argmax(1) == npz["dev_labels"]).mean()
    if task == "sst2":
        assert metrics["final_score"] == pytest.approx(right)


@pytest.mark.slow
def test_setfit_without_its_environment_names_how_to_build_it(
    tmp_path, params_dict, glue_dir, monkeypatch
) -> None:
    cells = {"peers": {"runs": ["setfit"], "tasks": ["sst2"], "fewshot": [4], "seeds": [1]}}
    write_study(tmp_path, params_dict(glue_dir), tasks=["sst2"], cells=cells,
                peers={"setfit": {"environment": "no-such-env"}})  # fmt: skip
    monkeypatch.chdir(tmp_path)
    runner, flag = CliRunner(), ["--campaign", "fewshot/params.yaml"]
    assert (
        runner.invoke(
            app, ["campaign", "prepare", "--task", "sst2", "--seed", "1", *flag]
        ).exit_code
        == 0
    )
    result = runner.invoke(
        app, ["campaign", "run", "--task", "sst2", "--run", "setfit-n4", "--seed", "1", *flag]
    )
    assert result.exit_code == 2
    assert (
        "setfit's environment no-such-env is missing: build it with `make setfit-env`"
        in result.output
    )
    assert "Traceback" not in result.output
    assert not (tmp_path / "fewshot/runs/sst2/setfit-n4-s1").exists()


@pytest.mark.slow
def test_setfit_run_end_to_end_on_the_tiny_model(
    tmp_path, params_dict, glue_dir, monkeypatch
) -> None:
    environment = ROOT / ".venv-setfit"
    if not (environment / "bin" / "python").exists():
        pytest.skip("SetFit's environment is not built here: `make setfit-env`")
    glue = tmp_path / "glue"
    shutil.copytree(glue_dir, glue)
    cells = {"peers": {"runs": ["setfit"], "tasks": ["sst2", "mrpc"], "fewshot": [8], "seeds": [1]}}
    peers = {"setfit": {"environment": str(environment), "num_iterations": 2}}
    write_study(tmp_path, params_dict(glue), cells=cells, peers=peers)
    monkeypatch.chdir(tmp_path)
    runner, flag = CliRunner(), ["--campaign", "fewshot/params.yaml"]
    for task in ("sst2", "mrpc"):
        assert (
            runner.invoke(
                app, ["campaign", "prepare", "--task", task, "--seed", "1", *flag]
            ).exit_code
            == 0
        )
        args = ["campaign", "run", "--task", task, "--run", "setfit-n8", "--seed", "1", *flag]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        folder = tmp_path / f"fewshot/runs/{task}/setfit-n8-s1"
        npz = np.load(folder / "predictions.npz")
        record = json.loads((folder / "run.json").read_text())
        assert npz["dev_logits"].shape == (1, len(npz["dev_labels"]), 2)
        np.testing.assert_allclose(
            np.exp(npz["dev_logits"][0]).sum(1), 1.0, atol=1e-4
        )  # log-probabilities
        peer = record["peer"]
        assert peer["versions"]["setfit"].startswith("1.")
        assert peer["arguments"]["num_iterations"] == 2 and peer["arguments"]["seed"] == 1
        assert (
            peer["pairs"] == 2 * 2 * 8 and peer["steps"] == 2
        )  # pairs = 2 x iterations x N, batch 16
        assert record["data"]["fewshot"]["examples"] == 8


@pytest.mark.parametrize("draws", [4, 10, 30])
def test_detectable_ratio_is_where_the_variance_test_has_half_power(draws) -> None:
    """At the true ratio detectable_ratio(k), a plain simulation of two normal samples of k
    declares 'lower' (variance ratio under the F test's 2.5% quantile) half the time."""
    from scipy.stats import f

    from aclpipe.study.fewshot.peers import detectable_ratio

    ratio = detectable_ratio(draws)
    rng = np.random.default_rng(draws)
    a = rng.normal(0.0, ratio, size=(40_000, draws))
    b = rng.normal(0.0, 1.0, size=(40_000, draws))
    declared = (a.var(axis=1, ddof=1) / b.var(axis=1, ddof=1)) < f.ppf(0.025, draws - 1, draws - 1)
    assert declared.mean() == pytest.approx(0.5, abs=0.01)
    assert detectable_ratio(2) is None


@pytest.mark.slow
def test_peer_claims_judge_each_method_against_setfit_and_ce_against_the_probe() -> None:
    from aclpipe.data.tasks import get_task
    from aclpipe.study.fewshot.peers import PEER_RESAMPLES, peer_claims, peer_family
    from aclpipe.study.stats.measures import Measure
    from aclpipe.study.stats.verdicts import Rules

    task, rng = get_task("sst2"), np.random.default_rng(3)
    labels = rng.integers(0, 2, 200)

    def runs(chance: float) -> dict[int, Measure]:  # each draw: examples right with this chance
        out = {}
        for seed in range(1, 6):
            hit = rng.random(len(labels)) < chance
            out[seed] = Measure("final", np.where(hit, labels, 1 - labels)[None])
        return out

    measures = {"ce": runs(0.9), "scl": runs(0.6), "setfit": runs(0.7), "linear-probe": runs(0.5)}
    planned = ["ce", "scl", "acl", "cosine-pairs", "setfit", "linear-probe"]
    rows = peer_claims(task, measures, {"ce", "scl", "setfit"}, labels, Rules(), planned)
    found = {(r["a"], r["b"]): r for r in rows}
    assert found[("ce", "setfit")]["verdict"] == "better" and found[("ce", "setfit")]["holds"]
    assert found[("scl", "setfit")]["verdict"] == "worse" and not found[("scl", "setfit")]["holds"]
    assert found[("acl", "setfit")]["verdict"] == "not run yet"
    assert found[("ce", "linear-probe")]["verdict"] == "better"
    assert found[("ce", "setfit")]["resamples"] == PEER_RESAMPLES
    plain = np.mean(
        [np.mean(m.predictions[0] == labels) for m in measures["ce"].values()]
    ) - np.mean([np.mean(m.predictions[0] == labels) for m in measures["setfit"].values()])
    assert found[("ce", "setfit")]["difference"] == pytest.approx(plain)
    cells = [{"task": "sst2", "peers": rows}]
    peer_family(cells, Rules())
    tested = [r for r in rows if "holm_p" in r]
    assert len(tested) == 3 and all(r["family"] == "peers/sst2" for r in tested)
    assert sorted(r["holm_p"] for r in tested) == pytest.approx(
        sorted(
            min(
                1.0, max((3 - j) * p for j, p in enumerate(sorted(r["p"] for r in tested)[: i + 1]))
            )
            for i in range(3)
        )
    )


@pytest.mark.parametrize("holm_below", [True, False])
@pytest.mark.parametrize("kind", ["superiority", "non-inferiority"])
@pytest.mark.parametrize("verdict", ["better", "worse", "comparable", "inconclusive", "uninformative"])
def test_holds_column_follows_holm(verdict: str, kind: str, holm_below: bool) -> None:
    """Both few-shot tables (the peers', a task's claims) answer "holds" after Holm: a claim
    that holds on its own p but whose Holm-adjusted p exceeds the level reads "no (not after
    Holm)"; the verdict is printed as before."""
    from types import SimpleNamespace

    from aclpipe.study.fewshot.markdown import _claims_table
    from aclpipe.study.fewshot.peers import peer_family, peer_section
    from aclpipe.study.stats import verdicts
    from aclpipe.study.stats.verdicts import Rules

    rules = Rules()
    p = rules.alpha / 2 if holm_below else 0.058  # 0.058: SST-2 N = 20's P2, over the level
    # the plain reference: the paper's wording; an uninformative claim holds nowhere and joins
    # no family; a family of one leaves its p as Holm's
    judged = verdict != "uninformative"
    holds = judged and (verdict == "better" or (kind == "non-inferiority" and verdict == "comparable"))
    expected = "no" if not holds else "yes" if p <= rules.alpha else "no (not after Holm)"

    def row(claim: str, question: str) -> dict:
        return {"claim": claim, "question": question, "a": "ce", "b": "linear-probe",
                "kind": kind, "verdict": verdict, "holds": holds, "p": p, "difference": 0.02,
                "low": -0.01, "high": 0.05, "seeds": [1, 2, 3], "planned": 3}  # fmt: skip

    peer, own = row("P2", "ce beats the linear probe"), row("S1", "CE+SCL beats CE")
    cells = [{"task": "sst2", "n": 20, "peers": [peer], "claims": [own]}]
    peer_family(cells, rules)
    verdicts.family([own] if judged else [], rules, rules.resamples)
    assert ("holm_p" in peer) == ("holm_p" in own) == judged
    peers = peer_section(SimpleNamespace(verdicts=rules), cells)
    claims = _claims_table(cells, "sst2", 3)
    for lines, head in ((peers, "| sst2 | 20 | P2 |"), (claims, "| 20 | S1 |")):
        found = [line for line in lines if line.startswith(head)]
        assert len(found) == 1 and found[0].split(" | ")[-1] == f"{expected} |"
        assert f"| {verdict} |" in found[0]


@pytest.mark.parametrize(
    "planned",
    [["setfit", "linear-probe"], ["ce", "setfit"], ["ce", "scl", "acl", "setfit", "linear-probe"],
     ["ce", "scl", "acl", "cosine-pairs", "setfit", "linear-probe"]],
)  # fmt: skip
def test_a_claim_on_a_run_not_planned_is_not_in_this_study(planned) -> None:
    from types import SimpleNamespace

    from aclpipe.data.tasks import get_task
    from aclpipe.study.fewshot.peers import PEER_CLAIMS, peer_claims, peer_section
    from aclpipe.study.stats.measures import Measure
    from aclpipe.study.stats.verdicts import Rules

    labels = np.array([0, 1, 1, 0])
    measures = {"setfit": {1: Measure("final", labels[None])}}  # nothing else has finished
    rows = peer_claims(get_task("cola"), measures, set(), labels, Rules(), planned)
    assert [(r["a"], r["b"]) for r in rows] == [(a, b) for _, _, a, b, _ in PEER_CLAIMS]
    for row in rows:  # the slow way: waiting only where both runs are planned
        both = row["a"] in planned and row["b"] in planned
        assert row["verdict"] == ("not run yet" if both else "not in this study")
    judged = {"claim": "P1", "question": "q", "a": "ce", "b": "setfit", "verdict": "better",
              "holds": True, "seeds": [1], "difference": 0.02, "low": 0.01, "high": 0.03,
              "p": 0.01}  # fmt: skip
    cells = [{"task": "cola", "n": 16, "peers": rows}, {"task": "sst2", "n": 20, "peers": [judged]}]
    text = "\n".join(peer_section(SimpleNamespace(verdicts=SimpleNamespace(margin=0.01)), cells))
    assert "| sst2 | 20 | P1 | q |" in text
    assert "not in this study" not in text and "| cola |" not in text
    assert ("Not run yet: cola N = 16." in text) == any(r["verdict"] == "not run yet" for r in rows)


@pytest.mark.parametrize(
    "runs", [["ce", "setfit", "linear-probe"], ["ce", "scl", "acl", "cosine-pairs", "setfit"]]
)
def test_a_cell_with_nothing_finished_lists_its_peer_claims_as_waiting(runs, monkeypatch) -> None:
    from types import SimpleNamespace

    from aclpipe.study.fewshot import report
    from aclpipe.study.stats.verdicts import Rules

    monkeypatch.setattr(report, "load_cell", lambda campaign, task, n: {})  # no run finished
    names = [f"{r}-n32" for r in runs] + ["ce-n16"]
    campaign = SimpleNamespace(
        runs=names, verdicts=Rules(), fewshot_runs={r: (r.rsplit("-n", 1)[0], int(r.rsplit("-n", 1)[1])) for r in names},
        seeds_at=lambda task, run: [1, 2, 3] if run in names else [],
    )  # fmt: skip
    cell = report.summarise_cell(campaign, "mrpc", 32)
    verdicts = {(r["a"], r["b"]): (r["verdict"], r["planned"]) for r in cell["peers"]}
    for (a, b), (verdict, planned) in verdicts.items():  # the slow way, claim by claim
        both = a in runs and b in runs
        assert verdict == ("not run yet" if both else "not in this study")
        assert planned == (3 if both else 0)
    assert ("ce", "setfit") in verdicts and len(verdicts) == 5


@pytest.mark.parametrize(
    "draws, planned, hollow",
    [
        ([10, 10, 30], [10, 10, 30], []),  # every point has its own plan: none partial
        ([10, 10, 30], [10, 10, 10], []),
        ([10, 7, 30], [10, 10, 30], [1]),
        ([10, 10, 29], [10, 10, 30], [2]),
        ([3, 10, 30], [30, 30, 30], [0, 1]),
    ],
)
def test_a_point_is_hollow_only_where_its_own_draws_are_short(draws, planned, hollow) -> None:
    """Each point against the draws planned for its N, not the largest plan of the line."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from aclpipe.study.fewshot.plots import _line

    ax = Figure().add_subplot()
    sizes = [16, 20, 100]
    partial = _line(ax, sizes, [50.0, 60.0, 70.0], draws, planned, "C0", "ce")
    assert partial == bool(hollow)
    empty = [line for line in ax.lines if line.get_markerfacecolor() == "white"]
    got = sorted(sizes.index(int(x)) for line in empty for x in line.get_xdata())
    assert got == hollow
