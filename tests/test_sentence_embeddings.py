"""Sentence-embedding training (simcse-unsup, simcse-sup), its data, and STS scoring.

Each objective against a plain, slow reference written here; the data builders on tiny GLUE
files; a tiny model trained and scored end to end through the command line; the bad inputs.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from cli_helpers import invoke, ok
from scipy import stats

from aclpipe.config import params_from_dict
from aclpipe.data.sentences import sup_rows, unsup_sentences
from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.modeling.batching import collate_sentences
from aclpipe.study.sts.report import weighted_ranks, weighted_spearman
from aclpipe.training.objectives import simcse_sup_loss, simcse_unsup_loss

TAU = 0.05
DOCS = Path(__file__).resolve().parents[1] / "docs" / "bad_inputs.md"
# docs/bad_inputs.md's rows that link here, in order: the words of the error the tests below check
DOC_CASES = {
    "sts-eval-no-scores": "no score column",
    "sts-eval-score-out-of-range": "outside STS's range 0 to 5",
    "sts-eval-pooling-not-trained": "trained with mean pooling and cannot give cls",
    "sentence-method-batch-of-one": "needs at least 2 rows per batch",
    "sentence-task-with-classifier": "sentence-embedding task: train it with",
}


# Plain references: one anchor at a time, the formula as written -------------------------------


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


def reference_unsup(first: list[torch.Tensor], second: list[torch.Tensor], tau: float) -> float:
    total = 0.0
    for i in range(len(first)):
        numerator = math.exp(cos(first[i], second[i]) / tau)
        denominator = sum(math.exp(cos(first[i], second[j]) / tau) for j in range(len(first)))
        total += -math.log(numerator / denominator)
    return total / len(first)


def reference_sup(rows: list[list[torch.Tensor]], tau: float) -> float:
    """rows: [anchor, positive] or [anchor, positive, hard negative]."""
    candidates = [row[1] for row in rows] + [row[2] for row in rows if len(row) == 3]
    total = 0.0
    for row in rows:
        numerator = math.exp(cos(row[0], row[1]) / tau)
        denominator = sum(math.exp(cos(row[0], c) / tau) for c in candidates)
        total += -math.log(numerator / denominator)
    return total / len(rows)


def interleave(first: list[torch.Tensor], second: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([v for pair in zip(first, second) for v in pair]).double()  # [2B, D]


def test_unsup_hand_checked() -> None:
    # Each sentence's two encodings agree (cosine 1) and are orthogonal to the other's
    # (cosine 0): l_i = -log(e^20 / (e^20 + e^0)) = log(1 + e^-20) at tau 0.05.
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 3.0])
    loss = simcse_unsup_loss(interleave([e1, e2], [2 * e1, e2]), TAU)
    assert float(loss) == pytest.approx(math.log1p(math.exp(-20)), rel=1e-9)
    # At tau 1: a's own second encoding is at 60 degrees (cosine 0.5), b's at 180 (cosine -1);
    # b's own is at 90 degrees (cosine 0), a's at 30 (cosine sin 60 = 0.866).
    a = torch.tensor([1.0, 0.0])
    a_plus = torch.tensor([math.cos(math.pi / 3), math.sin(math.pi / 3)], dtype=torch.float64)
    b, b_plus = torch.tensor([0.0, 1.0]), torch.tensor([-1.0, 0.0])
    expected = (
        -math.log(math.exp(0.5) / (math.exp(0.5) + math.exp(-1.0)))
        - math.log(1.0 / (1.0 + math.exp(math.sin(math.pi / 3))))
    ) / 2
    loss = simcse_unsup_loss(interleave([a, b], [a_plus, b_plus]), 1.0)
    assert float(loss) == pytest.approx(expected, rel=1e-9)


def test_unsup_matches_the_reference_on_random_and_duplicate_batches() -> None:
    torch.manual_seed(0)
    first = list(torch.randn(6, 8, dtype=torch.float64))
    second = list(torch.randn(6, 8, dtype=torch.float64))
    loss = simcse_unsup_loss(interleave(first, second), TAU)
    assert float(loss) == pytest.approx(reference_unsup(first, second, TAU), rel=1e-9)
    # The same sentence twice in a batch: each copy is the other's negative (as SimCSE). With
    # identical encodings everywhere, every row's softmax is uniform: log B.
    same = [torch.ones(4, dtype=torch.float64)] * 3
    assert float(simcse_unsup_loss(interleave(same, same), TAU)) == pytest.approx(math.log(3))
    dup_first, dup_second = first[:3] + [first[0]], second[:3] + [second[0]]
    loss = simcse_unsup_loss(interleave(dup_first, dup_second), TAU)
    assert float(loss) == pytest.approx(reference_unsup(dup_first, dup_second, TAU), rel=1e-9)


def test_unsup_refuses_a_batch_of_one() -> None:
    with pytest.raises(UserError, match="at least 2 sentences per batch"):
        simcse_unsup_loss(torch.randn(2, 4), TAU)


def test_sup_hand_checked_with_and_without_hard_negatives() -> None:
    e1, e2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    features = torch.stack([e1, 2 * e1, e2, e2]).double()  # rows (e1, e1), (e2, e2)
    loss = simcse_sup_loss(features, torch.tensor([2, 2]), TAU)
    assert float(loss) == pytest.approx(math.log1p(math.exp(-20)), rel=1e-9)
    # A hard negative for row 1 equal to its anchor: row 1's denominator gains e^20,
    # l_1 = log(2 + e^-20); row 2 sees it at cosine 0: l_2 = log(1 + 2 e^-20).
    features = torch.stack([e1, e1, e1, e2, e2]).double()
    loss = simcse_sup_loss(features, torch.tensor([3, 2]), TAU)
    expected = (math.log(2 + math.exp(-20)) + math.log1p(2 * math.exp(-20))) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-9)


def test_sup_matches_the_reference_on_mixed_and_duplicate_rows() -> None:
    torch.manual_seed(1)
    sizes = [2, 3, 2, 3, 2]
    rows = [list(torch.randn(n, 8).double()) for n in sizes]
    features = torch.stack([v for row in rows for v in row])
    loss = simcse_sup_loss(features, torch.tensor(sizes), TAU)
    assert float(loss) == pytest.approx(reference_sup(rows, TAU), rel=1e-9)
    duplicated = rows + [rows[0]]  # the same pair twice: each copy's positive is a negative
    features = torch.stack([v for row in duplicated for v in row])
    loss = simcse_sup_loss(features, torch.tensor(sizes + [2]), TAU)
    assert float(loss) == pytest.approx(reference_sup(duplicated, TAU), rel=1e-9)


def test_sup_refuses_a_batch_of_one() -> None:
    with pytest.raises(UserError, match="at least 2 pairs per batch"):
        simcse_sup_loss(torch.randn(3, 4), torch.tensor([3]), TAU)


def test_collate_sentences_lays_rows_out_row_major() -> None:
    rows = [{"sentences": [[5, 6, 7]]}, {"sentences": [[8]]}]
    batch = collate_sentences(rows, pad_id=0, views=2)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [5, 6, 7], [8, 0, 0], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 0, 0]]
    assert batch["labels"].tolist() == [2, 2]
    pairs = collate_sentences([{"sentences": [[1, 2], [3], [4]]}, {"sentences": [[5], [6]]}], 0)
    assert pairs["input_ids"][:, 0].tolist() == [1, 3, 4, 5, 6]
    assert pairs["labels"].tolist() == [3, 2]


# The data: tiny GLUE files ---------------------------------------------------------------------

STS_HEADER = (
    "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
)


def write_tsv(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def sts_line(i: int, a: str, b: str, score: float) -> str:
    return f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}\t{score:.3f}"


STS_TRAIN = [
    ("a man plays a guitar .", "the man plays the guitar .", 4.8),  # positive
    ("a man plays a guitar .", "the cat sits on the mat .", 0.4),  # its hard negative
    ("a dog runs .", "the dog runs today .", 4.0),  # positive, no low partner
    ("the woman said it was good .", "she said it was good .", 3.6),  # neither
    ("a dog runs .", "a man plays a guitar .", 1.6),  # above 1: not a negative
    ("the movie is fun .", "the film is fun .", 4.2),  # its second sentence is in dev
]
STS_DEV = [
    ("the film is fun .", "a woman plays .", 1.0),
    ("a cat runs .", "a cat runs today .", 4.5),
    ("the man sits .", "a man sits on the mat .", 3.9),
    ("a dog sits .", "the dog plays .", 2.0),
]


def write_glue(folder: Path) -> Path:
    write_tsv(folder / "SST-2" / "train.tsv", ["sentence\tlabel", "the movie was good .\t1",
                                                "a dog runs .\t0", "the movie was good . \t1"])  # fmt: skip
    write_tsv(folder / "SST-2" / "dev.tsv", ["sentence\tlabel", "dev sentence .\t1"])
    write_tsv(
        folder / "CoLA" / "train.tsv", ["gj04\t1\t\tthe cat sits .", "gj04\t0\t*\tsits cat ."]
    )
    write_tsv(folder / "CoLA" / "dev.tsv", ["gj04\t1\t\tcola dev ."])
    mrpc = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    write_tsv(folder / "MRPC" / "train.tsv", [mrpc, "1\t1\t2\the said so .\the said it .",
                                              "0\t3\t4\tshe runs .\the runs ."])  # fmt: skip
    write_tsv(folder / "MRPC" / "dev.tsv", [mrpc, "1\t5\t6\tmrpc dev .\tmrpc dev ."])
    rte = "index\tsentence1\tsentence2\tlabel"
    write_tsv(folder / "RTE" / "train.tsv", [rte, "0\tthe dog plays .\ta dog plays .\tentailment",
                                             "1\tthe dog plays .\ta cat .\tnot_entailment"])  # fmt: skip
    write_tsv(folder / "RTE" / "dev.tsv", [rte, "0\trte dev .\trte dev .\tentailment"])
    write_tsv(folder / "STS-B" / "train.tsv",
              [STS_HEADER, *(sts_line(i, *r) for i, r in enumerate(STS_TRAIN))])  # fmt: skip
    write_tsv(folder / "STS-B" / "dev.tsv",
              [STS_HEADER, *(sts_line(i, *r) for i, r in enumerate(STS_DEV))])  # fmt: skip
    test = [f"main-captions\tMSRvid\t2012test\t{i:04d}\t{s:.3f}\t{a}\t{b}"
            for i, (a, b, s) in enumerate(STS_DEV[::-1])]  # fmt: skip
    test[0] += "\tsource-a\tsource-b"  # the STS Benchmark's 9-field lines
    write_tsv(folder / "STS-B" / "original" / "sts-test.tsv", test)
    return folder


def test_unsup_sentences_every_train_sentence_once_never_dev_or_test(tmp_path: Path) -> None:
    glue = write_glue(tmp_path / "glue")
    held = {"the film is fun .", "a woman plays ."}
    sentences, counts = unsup_sentences(glue, held)
    assert sentences[:3] == ["the movie was good .", "a dog runs .", "the cat sits ."]
    assert len(sentences) == len(set(sentences))
    assert "the film is fun ." not in sentences and "dev sentence ." not in sentences
    assert "the movie is fun ." in sentences  # its partner is in dev, it is not
    assert counts["read"] == {"sst2": 3, "cola": 2, "mrpc": 4, "rte": 4, "stsb": 12}
    assert counts["in_sts_dev_or_test_dropped"] == 1
    assert counts["kept"] == len(sentences) == counts["unique"] - 1


def test_sup_rows_positives_and_hard_negatives(tmp_path: Path) -> None:
    glue = write_glue(tmp_path / "glue")
    rows, counts = sup_rows(glue, {"the film is fun ."})
    assert rows == [
        ("a man plays a guitar .", "the man plays the guitar .", "the cat sits on the mat ."),
        ("a dog runs .", "the dog runs today ."),
        ("he said so .", "he said it ."),  # MRPC paraphrase; its non-paraphrase is not used
        ("the dog plays .", "a dog plays ."),  # RTE entailment; not_entailment is not a negative
    ]
    assert counts["positive_pairs"] == {"stsb": 3, "mrpc": 1, "rte": 1}
    assert counts["in_sts_dev_or_test_dropped"] == 1  # ("the movie is fun .", "the film is fun .")
    assert counts["with_hard_negative"] == 1 and counts["rows"] == 4


# End to end on a tiny model: prepare, finetune, sts-eval ------------------------------------


@pytest.fixture()
def project(tmp_path: Path, tiny_model_dir: Path, params_dict, monkeypatch) -> Path:
    glue = write_glue(tmp_path / "glue")
    raw = params_dict(glue, train={"batch_size": 4, "epochs": 1}, model={"pooling": "mean"})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("task", "method", "pooling"),
    [("sentences", "simcse-unsup", "layer-attention"), ("sentence-pairs", "simcse-sup", "cls")],
)
def test_train_and_score_end_to_end(project: Path, task: str, method: str, pooling: str) -> None:
    ok("prepare", "--task", task)
    meta = json.loads((project / "data" / task / "meta.json").read_text(encoding="utf-8"))
    assert meta["splits"]["dev"]["examples"] == len(STS_DEV)
    assert (
        meta["built"]["kept" if task == "sentences" else "rows"]
        == meta["splits"]["train"]["examples"]
    )
    ok("finetune", "--task", task, "--method", method, "--set", f"model.pooling={pooling}")
    model_dir = project / "models" / task / method
    assert (model_dir / "dvclive" / "metrics.json").is_file()
    out = ok("sts-eval", "--model-dir", str(model_dir), "--out", "sts.json")
    assert "trained" in out
    result = json.loads((project / "sts.json").read_text(encoding="utf-8"))
    assert result["trained"]["pooling"] == pooling
    assert result["pairs"]["test"]["examples"] == len(STS_DEV)
    assert set(result["zero_shot"]) == set(result["encoder_layers"]) == {"dev", "test"}
    # The trained score on dev is the loop's own last dev score: the same model and pairs.
    history = json.loads((model_dir / "dvclive" / "metrics.json").read_text(encoding="utf-8"))
    dev_score = [v for k, v in flat(history).items() if k.endswith("score_L3")]
    assert result["trained"]["spearman"]["dev"] == pytest.approx(dev_score[0], abs=1e-6)
    # The test file is dev reversed: the same pairs, so the same Spearman.
    spearmans = result["trained"]["spearman"]
    assert spearmans["test"] == pytest.approx(spearmans["dev"], abs=1e-9)


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_methods_and_tasks_must_fit(project: Path) -> None:
    ok("prepare", "--task", "sentences")
    for args, message in [
        (("--task", "sentences", "--method", "ce"), "sentence-embedding task: train it with"),
        (("--task", "sentences", "--method", "simcse-unsup", "--set", "train.batch_size=1"),
         "needs at least 2 rows per batch"),
    ]:  # fmt: skip
        result = invoke("finetune", *args)
        assert result.exit_code == 2, result.output
        assert message in result.output and len(result.output.strip().splitlines()) == 1
    for stage, message in (("evaluate", "score it with `aclpipe sts-eval"),
                           ("export-exits", "no exits to export")):  # fmt: skip
        result = invoke(stage, "--task", "sentences", "--method", "simcse-unsup")
        assert result.exit_code == 2 and message in result.output, result.output
    ok("prepare", "--task", "sst2")
    result = invoke("finetune", "--task", "sst2", "--method", "simcse-unsup")
    assert result.exit_code == 2 and "trains sentence embeddings" in result.output
    assert not (project / "models" / "sst2").exists()


def test_contrastive_classifiers_still_refuse_stsb(project: Path) -> None:
    ok("prepare", "--task", "stsb")
    result = invoke("finetune", "--task", "stsb", "--method", "scl")
    assert result.exit_code == 2 and "STS-B is regression" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("file_lines", "message"),
    [
        (
            [STS_HEADER.rsplit("\t", 1)[0], "0\tg\tf\ty\t0\tn\tn\ta man .\ta dog ."],
            "no score column",
        ),
        (["g\tf\ty\t0\t\ta man .\ta dog ."], "is not a number"),
        (["g\tf\ty\t0\t5.5\ta man .\ta dog ."], "outside STS's range 0 to 5"),
    ],
)
def test_sts_eval_bad_pair_files_write_nothing(
    project: Path, file_lines: list[str], message: str
) -> None:
    write_tsv(project / "bad.tsv", file_lines)
    result = invoke("sts-eval", "--test-file", "bad.tsv", "--out", "sts.json")
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (project / "sts.json").exists()


def test_sts_eval_pooling_the_model_cannot_give(project: Path) -> None:
    ok("prepare", "--task", "sentences")
    ok("finetune", "--task", "sentences", "--method", "simcse-unsup")
    model_dir = str(project / "models" / "sentences" / "simcse-unsup")
    result = invoke("sts-eval", "--model-dir", model_dir, "--pooling", "cls", "--out", "s.json")
    assert result.exit_code == 2, result.output
    assert "trained with mean pooling and cannot give cls" in result.output
    assert not (project / "s.json").exists()


# The study's statistic: Spearman under bootstrap counts -------------------------------------


def test_weighted_spearman_is_spearman_of_the_repeated_pairs() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(size=12)
    gold = np.round(rng.uniform(0, 5, 12))  # ties, as STS's gold scores have
    values[3] = values[7]  # a tie in the similarities too
    weights = rng.integers(0, 3, size=(5, 12)).astype(float)
    weights[:, 0] += 1  # never empty
    got = weighted_spearman(values, gold, weights)
    for r, w in enumerate(weights):
        idx = np.repeat(np.arange(12), w.astype(int))
        assert got[r] == pytest.approx(stats.spearmanr(values[idx], gold[idx])[0], abs=1e-12)
    ranks = weighted_ranks(np.array([3.0, 1.0, 3.0]), np.array([[1, 2, 1]]))
    assert ranks.tolist() == [[3.5, 1.5, 3.5]]  # 1 1 | 3 3: average ranks 1.5 and 3.5
    assert weighted_spearman(np.ones(4), np.arange(4.0), np.ones((1, 4)))[0] == 0.0


def test_sentence_tasks_are_tasks() -> None:
    assert get_task("sentences").embeds and get_task("sentence-pairs").embeds
    assert not get_task("stsb").embeds
    params = params_from_dict({})
    assert params.method("simcse-unsup").tau == 0.05 and params.method("simcse-sup").tau == 0.05
    with pytest.raises(UserError, match="sentence-pairs"):
        get_task("sentence")


# Resumable like any method ----------------------------------------------------------------


def test_interrupted_sentence_run_resumes_to_the_same_bits(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console
    from safetensors.torch import load_file

    from aclpipe.config import load_params
    from aclpipe.stages.finetune import finetune
    from aclpipe.training import loop

    ok("prepare", "--task", "sentences")
    params = load_params(
        project / "params.yaml", ["train.save_every=1", "train.epochs=2", "train.batch_size=2"]
    )
    task, data, quiet = get_task("sentences"), project / "data" / "sentences", Console(quiet=True)
    finetune(task, "simcse-unsup", params, data, project / "reference", quiet)

    real_step, calls = loop._optimizer_step, []

    def step_then_stop(optimizer, global_step: int) -> None:
        calls.append(global_step)
        if len(calls) == 4:
            raise KeyboardInterrupt  # the fourth step never happens
        real_step(optimizer, global_step)

    monkeypatch.setattr(loop, "_optimizer_step", step_then_stop)
    with pytest.raises(KeyboardInterrupt):
        finetune(task, "simcse-unsup", params, data, project / "resumed", quiet)
    monkeypatch.setattr(loop, "_optimizer_step", real_step)
    record = Console(record=True)
    finetune(task, "simcse-unsup", params, data, project / "resumed", record)
    assert "resuming simcse-unsup on sentences" in record.export_text()
    got, want = (
        load_file(project / "resumed" / "model.safetensors"),
        load_file(project / "reference" / "model.safetensors"),
    )
    assert [k for k in want if not torch.equal(got[k], want[k])] == []


# The study's commands (the report's verdicts: tests/test_sts_report.py) -------------------


def test_study_commands_end_to_end(
    tmp_path: Path, tiny_model_dir: Path, params_dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aclpipe sts prepare / zero-shot / run / report on the tiny model, as sts/dvc.yaml runs
    them from the repository root."""
    glue = write_glue(tmp_path / "glue")
    raw = params_dict(glue, train={"batch_size": 4, "epochs": 1})
    raw["pipeline"] = {"tasks": [], "methods": []}
    raw["sts"] = {
        "objectives": {"unsup": {"method": "simcse-unsup", "task": "sentences"}},
        "poolings": ["mean", "layer-attention"],
        "seeds": [1, 2],
    }
    (tmp_path / "sts").mkdir()
    (tmp_path / "sts" / "params.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    ok("sts", "prepare", "--task", "sentences")
    ok("sts", "zero-shot")
    for pooling in ("mean", "layer-attention"):
        for seed in (1, 2):
            ok("sts", "run", "--objective", "unsup", "--pooling", pooling, "--seed", str(seed))
    run = tmp_path / "sts" / "runs" / "unsup-layer-attention-s2"
    record = json.loads((run / "run.json").read_text(encoding="utf-8"))
    assert record["pooling"] == "layer-attention" and record["seed"] == 2
    assert record["train"]["seed"] == 2 and record["result"]["trained"]["pooling"] == pooling
    assert (run / "dvclive" / "metrics.json").is_file()
    assert not list((tmp_path / "sts" / "models").rglob("*.safetensors"))  # weights dropped
    ok("sts", "report")
    text = (tmp_path / "reports" / "sts" / "README.md").read_text(encoding="utf-8")
    assert "| unsup: layer-attention beats mean |" in text and "(2 seeds only)" in text
    assert "| unsup | cls |" not in text  # only the study's poolings
    result = invoke("sts", "run", "--objective", "sup", "--pooling", "mean", "--seed", "1")
    assert result.exit_code == 2 and "unknown objective 'sup'" in result.output


def test_docs_show_these_cases() -> None:
    """docs/bad_inputs.md's rows that link here: these cases, in order, each showing the error
    its test checks, with four filled cells."""
    rows = [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        for line in DOCS.read_text(encoding="utf-8").splitlines()
        if "test_sentence_embeddings.py" in line and line.startswith("| [")
    ]
    assert [re.match(r"\[`([^`]+)`\]", row[0]).group(1) for row in rows] == list(DOC_CASES)
    for row, message in zip(rows, DOC_CASES.values()):
        assert len(row) == 4 and all(row), row
        assert message in row[2], (row[0], row[2])
