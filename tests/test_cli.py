"""The command line end to end on the tiny model and tiny GLUE files, and its error contract.

Every user-fixable problem must exit with code 2 and one line starting with ``error:`` (no
traceback), and must leave no partial output behind.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import typer
import yaml
from cli_helpers import invoke
from paths import at

from aclpipe.cli import app
from aclpipe.errors import UserError
from aclpipe.layout import (
    META,
    METRICS,
    MODEL_CONFIG,
    PARAMS,
    TRADEOFF_MD,
    TRAINING_LOG,
    WEIGHTS,
    checkpoint_dir,
    split_file,
)
from aclpipe.run_log import read_run_log

STAGES = ("prepare", "finetune", "evaluate")


def write_params(folder: Path, raw: dict) -> None:
    (folder / PARAMS).write_text(yaml.safe_dump(raw), encoding="utf-8")


def ok(*args: str):
    result = invoke(*args)
    assert result.exit_code == 0, f"{args}: {result.output}"
    return result


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def assert_user_error(result, fragment: str = "") -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment in lines[0], lines[0]
    return lines[0]


def no_temp_leftovers(root: Path) -> None:
    leftovers = [p for p in root.rglob("*") if p.name.startswith((".tmp-", ".old-"))]
    assert not leftovers, leftovers


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, params_dict, glue_dir: Path) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GLUE_DIR", raising=False)
    write_params(tmp_path, params_dict(glue_dir))
    return tmp_path


# Help ---------------------------------------------------------------------------------------


def test_help_mentions_every_option() -> None:
    group = typer.main.get_command(app)  # typer 0.29 vendors click: duck typing only
    assert set(STAGES) <= set(group.commands)
    result = ok("--help")
    for name in group.commands:
        assert name in result.output
    for name, command in group.commands.items():
        result = ok(name, "--help")
        for param in command.params:
            if param.param_type_name == "option" and not getattr(param, "hidden", False):
                assert any(opt in result.output for opt in param.opts), (name, param.opts)


def test_stage_options() -> None:
    group = typer.main.get_command(app)
    for stage, expected in (
        ("prepare", {"--task", "--params", "--set", "--glue-dir"}),
        ("finetune", {"--task", "--method", "--params", "--set"}),
        ("evaluate", {"--task", "--method", "--params", "--set"}),
    ):
        opts = {o for p in group.commands[stage].params for o in p.opts}
        assert expected <= opts, stage


# End to end -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sst2_run(tmp_path_factory: pytest.TempPathFactory, params_dict,
             glue_dir: Path) -> Iterator[Path]:  # fmt: skip
    """prepare -> finetune (ce, joint, deebert) -> evaluate for SST-2, once for the module."""
    work = tmp_path_factory.mktemp("sst2-run")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.delenv("GLUE_DIR", raising=False)
        write_params(work, params_dict(glue_dir))
        ok("prepare", "--task", "sst2")
        ok("finetune", "--task", "sst2")  # pipeline.methods: ce and joint
        ok("finetune", "-t", "sst2", "-m", "deebert", "--set", "train.epochs=1")
        ok("evaluate", "--task", "sst2")
        ok("evaluate", "--task", "sst2", "--method", "deebert")
    yield work


@pytest.mark.slow
def test_prepare_output(sst2_run: Path) -> None:
    data = at(sst2_run).data("sst2")
    names = [split_file(data, "dev").name, META, split_file(data, "train").name]
    assert sorted(p.name for p in data.iterdir()) == sorted(names)
    meta = json.loads((data / META).read_text())
    assert meta["task"] == "sst2" and meta["source"].startswith("local:")
    assert meta["max_length"] == 32
    assert meta["splits"]["train"]["examples"] == 48
    assert meta["splits"]["dev"]["examples"] == 16
    assert meta["splits"]["train"]["labels"] == {"0": 24, "1": 24}
    assert meta["splits"]["dev"]["labels"] == {"0": 8, "1": 8}
    for split, n in (("train", 48), ("dev", 16)):
        rows = [json.loads(line) for line in split_file(data, split).read_text().splitlines()]
        assert len(rows) == n
        assert all(len(r["input_ids"]) <= 32 and r["label"] in (0, 1) for r in rows)
    no_temp_leftovers(sst2_run)


@pytest.mark.parametrize(
    ("method", "exits", "epochs"),
    [("ce", [3], 1), ("joint", [1, 2, 3], 1), ("deebert", [1, 2, 3], 2)],
)
@pytest.mark.slow
def test_finetune_and_evaluate_output(sst2_run: Path, method: str, exits: list[int],
                                      epochs: int) -> None:  # fmt: skip
    model = at(sst2_run).model("sst2", method)
    files = {p.name for p in model.iterdir()}
    assert {WEIGHTS, MODEL_CONFIG, TRAINING_LOG} <= files
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl"))]
    assert not checkpoint_dir(model).exists()
    log = read_run_log(model)
    assert log.run["task"] == "sst2" and log.run["method"] == method
    assert log.run["exits"] == exits
    assert len(log.history) == epochs  # one record per epoch of each stage
    summary = json.loads((model / TRAINING_LOG / "metrics.json").read_text())  # DVCLive's: `dvc exp show`
    assert summary["step"] == log.steps[-1]["step"] and f"score_L{exits[-1]}" in summary["dev"]
    assert [e["stage"] for e in log.history] == list(range(1, epochs + 1))
    assert all(len(e["dev_scores"]) == len(exits) for e in log.history)

    report = json.loads((at(sst2_run).report("sst2", method) / METRICS).read_text())
    assert report["task"] == "sst2" and report["method"] == method and report["exits"] == exits
    dev = report["splits"]["dev"]
    assert dev["examples"] == 16
    assert [e["layer"] for e in dev["per_exit"]] == exits
    scores = [e["score"] for e in dev["per_exit"]]
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert all(set(e["metrics"]) == {"accuracy"} for e in dev["per_exit"])
    assert dev["average_over_exits"] == pytest.approx(sum(scores) / len(scores))
    assert dev["final_score"] == scores[-1] == report["final_score"]
    assert report["average_over_exits"] == dev["average_over_exits"]
    no_temp_leftovers(sst2_run)


@pytest.mark.slow
def test_stsb_joint_end_to_end(workdir: Path) -> None:
    ok("prepare", "--task", "stsb")
    meta = json.loads((at(workdir).data("stsb") / META).read_text())
    assert meta["splits"]["train"]["examples"] == 16
    assert set(meta["splits"]["train"]["labels"]) == {"min", "max", "mean"}
    ok("finetune", "--task", "stsb", "--method", "joint")
    ok("evaluate", "--task", "stsb", "--method", "joint")
    report = json.loads((at(workdir).report("stsb", "joint") / METRICS).read_text())
    per_exit = report["splits"]["dev"]["per_exit"]
    assert [e["layer"] for e in per_exit] == [1, 2, 3]
    assert all(set(e["metrics"]) == {"pearson", "spearman"} for e in per_exit)
    scores = [e["score"] for e in per_exit]
    assert report["average_over_exits"] == pytest.approx(sum(scores) / 3)


def test_prepare_without_task_runs_pipeline_tasks(workdir: Path) -> None:
    ok("prepare")
    assert sorted(p.name for p in at(workdir).data().iterdir()) == ["mrpc", "sst2"]
    meta = json.loads((at(workdir).data("mrpc") / META).read_text())
    assert meta["splits"]["train"]["examples"] == 12
    rows = at(workdir).split("mrpc", "train").read_text().splitlines()
    assert all(1 in json.loads(r)["token_type_ids"] for r in rows)  # MRPC read as pairs


def test_prepare_subsample_through_set(workdir: Path) -> None:
    ok("prepare", "-t", "sst2", "-S", "data.max_train_samples=10", "-S", "data.max_eval_samples=4")
    meta = json.loads((at(workdir).data("sst2") / META).read_text())
    assert meta["splits"]["train"]["examples"] == 10 and meta["splits"]["dev"]["examples"] == 4


# Bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", STAGES)
def test_unknown_task(workdir: Path, stage: str) -> None:
    assert_user_error(invoke(stage, "--task", "sst3"), "unknown task 'sst3'")
    assert not at(workdir).data().exists() and not at(workdir).models().exists()


@pytest.mark.parametrize("stage", ["finetune", "evaluate"])
def test_unknown_method(workdir: Path, stage: str) -> None:
    assert_user_error(invoke(stage, "-t", "sst2", "-m", "acl_cl"), "unknown method 'acl_cl'")
    assert not at(workdir).models().exists() and not at(workdir).reports().exists()


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize(
    ("item", "fragment"),
    [("train.learning_rate=1", "train.learning_rate"), ("train.lr", "key=value"),
     ("train.batch_size=0", "train.batch_size"), ("model.pooling=max", "model.pooling"),
     ("evaluate.engines=[torch,tensorrt]", "evaluate.engines[1]")],
)  # fmt: skip
def test_bad_set(workdir: Path, stage: str, item: str, fragment: str) -> None:
    assert_user_error(invoke(stage, "-t", "sst2", "--set", item), fragment)
    assert not at(workdir).data().exists()


def test_bad_params_file(workdir: Path) -> None:
    (workdir / PARAMS).write_text("train:\n  lr: [1\n", encoding="utf-8")
    assert_user_error(invoke("prepare", "-t", "sst2"), "not valid YAML")
    assert_user_error(invoke("prepare", "--params", "missing.yaml"), "not found")


def test_missing_glue_file_offline(workdir: Path, tmp_path_factory) -> None:
    glue = tmp_path_factory.mktemp("glue-missing-dev")
    shutil.copytree(Path(yaml.safe_load((workdir / PARAMS).read_text())["data"]
                         ["glue_dir"]) / "SST-2", glue / "SST-2")  # fmt: skip
    (glue / "SST-2" / "dev.tsv").unlink()
    line = assert_user_error(invoke("prepare", "-t", "sst2", "--glue-dir", str(glue)))
    assert "HF_HUB_OFFLINE" in line and "--glue-dir" in line
    assert not at(workdir).data("sst2").exists()
    no_temp_leftovers(workdir)


def test_failing_rerun_keeps_good_data(workdir: Path, tmp_path_factory) -> None:
    ok("prepare", "-t", "sst2")
    data = at(workdir).data("sst2")
    before = tree_digest(data)
    glue = tmp_path_factory.mktemp("glue-bad-label")
    source = Path(yaml.safe_load((workdir / PARAMS).read_text())["data"]["glue_dir"])
    shutil.copytree(source / "SST-2", glue / "SST-2")
    dev = glue / "SST-2" / "dev.tsv"
    dev.write_text(dev.read_text() + "the movie was fine \tmaybe\n", encoding="utf-8")
    line = assert_user_error(invoke("prepare", "-t", "sst2", "--glue-dir", str(glue)))
    assert "dev.tsv, line 18" in line and "maybe" in line  # header + 16 rows + the bad one
    (glue / "SST-2" / "dev.tsv").unlink()
    assert_user_error(invoke("prepare", "-t", "sst2", "--glue-dir", str(glue)))
    assert_user_error(invoke("prepare", "-t", "sst2", "--set", "model.name=./no-model"))
    assert tree_digest(data) == before
    no_temp_leftovers(workdir)


def test_unknown_model_offline(workdir: Path) -> None:
    line = assert_user_error(
        invoke("prepare", "-t", "sst2", "--set", "model.name=aclpipe-tests/no-such-model")
    )
    assert "HF_HUB_OFFLINE" in line
    assert not at(workdir).data().exists()


def test_stages_out_of_order(workdir: Path) -> None:
    assert_user_error(invoke("finetune", "-t", "sst2", "-m", "ce"), "aclpipe prepare --task sst2")
    ok("prepare", "-t", "sst2")
    assert_user_error(invoke("evaluate", "-t", "sst2", "-m", "ce"), "aclpipe finetune")
    assert not at(workdir).reports().exists()


def test_finetune_with_another_model_than_prepared(workdir: Path, tmp_path: Path) -> None:
    ok("prepare", "-t", "sst2")
    other = tmp_path / "other-model"
    shutil.copytree(Path(yaml.safe_load((workdir / PARAMS).read_text())["model"]
                         ["name"]), other)  # fmt: skip
    result = invoke("finetune", "-t", "sst2", "-m", "ce", "--set", f"model.name={other}")
    assert_user_error(result, "was tokenized for")
    assert not at(workdir).models().exists()


def test_contrastive_method_on_regression_task(workdir: Path) -> None:
    ok("prepare", "-t", "stsb")
    assert_user_error(invoke("finetune", "-t", "stsb", "-m", "scl"), "regression")
    assert not at(workdir).model("stsb", "scl").exists()
    no_temp_leftovers(workdir)


def test_evaluate_truncated_model(workdir: Path) -> None:
    ok("prepare", "-t", "sst2")
    ok("finetune", "-t", "sst2", "-m", "ce")
    weights = at(workdir).model("sst2", "ce") / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:1000])
    assert_user_error(invoke("evaluate", "-t", "sst2", "-m", "ce"), "damaged or truncated")
    assert not at(workdir).reports().exists()


# Option style --------------------------------------------------------------------------------


def test_help_lists_the_task_and_method_tables() -> None:
    from aclpipe.data.tasks import TASKS
    from aclpipe.training.methods import METHODS

    text = " ".join(ok("finetune", "--help").output.split())  # rich wraps the help
    assert all(name in text for name in [*TASKS, *METHODS])
    assert "--methods" not in ok("tradeoff", "--help").output  # the old spelling is hidden


@pytest.mark.slow
def test_method_lists_read_the_same_every_way(sst2_run: Path, monkeypatch) -> None:
    """-m repeated, -m with commas and the hidden old --methods choose the same methods."""
    monkeypatch.chdir(sst2_run)
    report = at(sst2_run).reports("sst2") / TRADEOFF_MD
    texts = []
    for args in (["-m", "ce", "-m", "joint"], ["-m", " ce,joint"], ["--methods", "ce,joint"],
                 ["-m", "ce,joint", "-m", "ce"]):  # fmt: skip
        ok("tradeoff", "-t", "sst2", *args)
        texts.append(report.read_text())
    assert texts == [texts[0]] * 4 and "joint" in texts[0] and "deebert" not in texts[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [(["-m", "ce,"], "--method 'ce,' has an empty item"),
     (["-m", "ce", "-m", "acl_cl"], "unknown method 'acl_cl'"),
     (["-t", "sst2,sst3"], "unknown task 'sst3'")],
)  # fmt: skip
def test_bad_name_lists(workdir: Path, args: list[str], fragment: str) -> None:
    assert_user_error(invoke("finetune", "-t", "sst2", *args), fragment)
    assert not at(workdir).models().exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_evaluate_on_cuda_without_a_gpu(workdir: Path) -> None:
    from aclpipe.modeling.device import pick_device

    assert pick_device("auto") == pick_device("cpu") == "cpu"
    line = assert_user_error(invoke("evaluate", "-t", "sst2", "--set", "train.device=cuda"))
    assert line == "error: train.device is cuda but no GPU is visible: set train.device=auto or cpu"


@pytest.mark.parametrize("error", [UserError, RuntimeError])
def test_error_lines_with_brackets_print_as_they_are(error, monkeypatch) -> None:
    """gloo's messages carry `[/path:line]`, which rich would read as markup and crash on."""
    import aclpipe.cli as cli

    message = "[/__w/pytorch/gloo/transport.cc:154] Connection closed by peer [bold]"

    def boom(*args, **kwargs):
        raise error(message)

    monkeypatch.setattr(cli, "load", boom)  # what finetune calls first (cli_options.load)
    result = invoke("finetune", "--task", "sst2", "--method", "ce")
    assert result.exit_code == (2 if error is UserError else 1)
    assert message in result.stderr and "Traceback" not in result.stderr
