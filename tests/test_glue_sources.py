"""The GLUE readers on small files written in each task's exact classic layout."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import pytest

from aclpipe.data.glue_sources import Example, local_available, read_hub, read_local
from aclpipe.data.tasks import TASKS
from aclpipe.errors import UserError

BOM = "\ufeff"
MNLI_DEV_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\t"
    "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
)
MNLI_TRAIN_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
)
STSB_HEADER = (
    "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
)


def mnli_row(i: int, s1: str, s2: str, labels: list[str]) -> str:
    return "\t".join([str(i), "31193", f"{i}n", "government", "( x )", "( y )", "(ROOT x)",
                      "(ROOT y)", s1, s2, *labels]) + "\n"  # fmt: skip


# For each task: {file stem: content} and {split: expected examples}.
CASES: dict[str, tuple[dict[str, str], dict[str, list[Example]]]] = {
    "cola": (
        {
            "train": "gj04\t1\t\tOur friends won't buy this analysis.\n"
            'gj04\t0\t*\tThey drank the "pub.\n',
            "dev": "bc01\t1\t\tThe sailors rode the breeze clear of the rocks.\n",
        },
        {
            "train": [
                Example("Our friends won't buy this analysis.", None, 1),
                Example('They drank the "pub.', None, 0),
            ],
            "dev": [Example("The sailors rode the breeze clear of the rocks.", None, 1)],
        },
    ),
    "sst2": (
        {
            "train": "sentence\tlabel\nhide new secretions from the parental units \t0\n"
            "it 's \"a charming journey \t1\n",
            "dev": "sentence\tlabel\nunflinchingly bleak and desperate \t0\n",
        },
        {
            "train": [
                Example("hide new secretions from the parental units ", None, 0),
                Example("it 's \"a charming journey ", None, 1),
            ],
            "dev": [Example("unflinchingly bleak and desperate ", None, 0)],
        },
    ),
    "mrpc": (
        {
            "train": BOM + "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
            '1\t702876\t702977\tAmrozi accused "the witness".\tReferring to him as "the witness".\n'
            "0\t2108705\t2108831\tYucaipa owned it.\tYucaipa bought it.\n",
            "dev": BOM + "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n"
            '1\t1355540\t1355592\tHe said so.\t"He said so.\r\n',
        },
        {
            "train": [
                Example('Amrozi accused "the witness".', 'Referring to him as "the witness".', 1),
                Example("Yucaipa owned it.", "Yucaipa bought it.", 0),
            ],
            "dev": [Example("He said so.", '"He said so.', 1)],
        },
    ),
    "qqp": (
        {
            "train": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
            "133273\t213221\t213222\tHow is the life of a math student?\tWhich level?\t0\n"
            "402555\t536040\t536041\tHow do I control anger?\tHow to control anger?\t1\n",
            "dev": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
            "1\t2\t3\tWhy?\tWhy not?\t0\n",
        },
        {
            "train": [
                Example("How is the life of a math student?", "Which level?", 0),
                Example("How do I control anger?", "How to control anger?", 1),
            ],
            "dev": [Example("Why?", "Why not?", 0)],
        },
    ),
    "stsb": (
        {
            "train": STSB_HEADER
            + "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\t"
            "An air plane is taking off.\t5.000\n"
            "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man plays a flute.\t"
            "A man plays a big flute.\t3.800\n",
            "dev": STSB_HEADER + "0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\t"
            "A man with a hard hat is dancing.\tA man is dancing.\t0.75\n",
        },
        {
            "train": [
                Example("A plane is taking off.", "An air plane is taking off.", 5.0),
                Example("A man plays a flute.", "A man plays a big flute.", 3.8),
            ],
            "dev": [Example("A man with a hard hat is dancing.", "A man is dancing.", 0.75)],
        },
    ),
    "mnli": (
        {
            "train": MNLI_TRAIN_HEADER
            + mnli_row(0, "Conceptually cream skimming.", "Product and geography.", ["neutral"] * 2)
            + mnli_row(1, "you know during the season", "You lose the things", ["entailment"] * 2),
            "dev_matched": MNLI_DEV_HEADER
            + mnli_row(
                0,
                "The new rights are nice.",
                "Everyone loves them.",
                ["neutral", "entailment", "neutral", "neutral", "neutral", "neutral"],
            ),  # fmt: skip
            "dev_mismatched": MNLI_DEV_HEADER
            + mnli_row(
                0,
                "Your contribution helped.",
                "It did not help.",
                ["contradiction"] * 5 + ["contradiction"],
            ),  # fmt: skip
        },
        {
            "train": [
                Example("Conceptually cream skimming.", "Product and geography.", 1),
                Example("you know during the season", "You lose the things", 0),
            ],
            "dev_matched": [Example("The new rights are nice.", "Everyone loves them.", 1)],
            "dev_mismatched": [Example("Your contribution helped.", "It did not help.", 2)],
        },
    ),
    "qnli": (
        {
            "train": "index\tquestion\tsentence\tlabel\n"
            "0\tWhen did it open?\tIt opened in 1900.\tentailment\n"
            "1\tWho built it?\tIt is tall.\tnot_entailment\n",
            "dev": "index\tquestion\tsentence\tlabel\n0\tWhat?\tThat.\tnot_entailment\n",
        },
        {
            "train": [
                Example("When did it open?", "It opened in 1900.", 0),
                Example("Who built it?", "It is tall.", 1),
            ],
            "dev": [Example("What?", "That.", 1)],
        },
    ),
    "rte": (
        {
            "train": "index\tsentence1\tsentence2\tlabel\n"
            "0\tNo Weapons Found in Iraq Yet.\tWeapons Found in Iraq.\tnot_entailment\n"
            "1\tPope Benedict XVI was installed.\tBenedict is the new Pope.\tentailment\n",
            "dev": "index\tsentence1\tsentence2\tlabel\n"
            "0\tDana Reeve died.\tReeve died.\tentailment\n",
        },
        {
            "train": [
                Example("No Weapons Found in Iraq Yet.", "Weapons Found in Iraq.", 1),
                Example("Pope Benedict XVI was installed.", "Benedict is the new Pope.", 0),
            ],
            "dev": [Example("Dana Reeve died.", "Reeve died.", 0)],
        },
    ),
    "wnli": (
        {
            "train": "index\tsentence1\tsentence2\tlabel\n"
            "0\tI stuck a pin through a carrot.\tThe carrot had a hole.\t1\n"
            "1\tJohn couldn't see the stage.\tJohn is so tall.\t0\n",
            "dev": "index\tsentence1\tsentence2\tlabel\n"
            "0\tThe drain is clogged.\tThe hair is clogged.\t0\n",
        },
        {
            "train": [
                Example("I stuck a pin through a carrot.", "The carrot had a hole.", 1),
                Example("John couldn't see the stage.", "John is so tall.", 0),
            ],
            "dev": [Example("The drain is clogged.", "The hair is clogged.", 0)],
        },
    ),
}


def write(glue_dir: Path, folder: str, stem: str, content: str | bytes) -> Path:
    path = glue_dir / folder / f"{stem}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def test_cases_cover_all_tasks() -> None:
    assert set(CASES) == set(TASKS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_read_local_each_task(tmp_path: Path, name: str) -> None:
    task = TASKS[name]
    files, expected = CASES[name]
    assert not local_available(task, tmp_path)
    for stem, content in files.items():
        write(tmp_path, task.folder, stem, content)
    assert local_available(task, tmp_path)
    assert set(expected) == {"train", *(split for split, _, _ in task.dev_splits)}
    for split, examples in expected.items():
        assert read_local(task, tmp_path, split) == examples


def test_local_available_needs_every_file(tmp_path: Path) -> None:
    mnli = TASKS["mnli"]
    assert not local_available(mnli, None)
    write(tmp_path, "MNLI", "train", MNLI_TRAIN_HEADER)
    write(tmp_path, "MNLI", "dev_matched", MNLI_DEV_HEADER)
    assert not local_available(mnli, tmp_path)  # dev_mismatched is missing


def assert_user_error(exc: pytest.ExceptionInfo[UserError], path: Path, line: int) -> str:
    message = str(exc.value)
    assert "\n" not in message
    assert str(path) in message
    assert f"line {line}:" in message
    return message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError) as exc:
        read_local(TASKS["rte"], tmp_path, "dev")
    message = str(exc.value)
    assert str(tmp_path / "RTE" / "dev.tsv") in message
    assert f"looked in {tmp_path / 'RTE'}" in message
    for how in ("--glue-dir", "GLUE_DIR", "data.glue_dir"):
        assert how in message


def test_unknown_split(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="dev_matched, dev_mismatched"):
        read_local(TASKS["mnli"], tmp_path, "dev")


def test_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path, "SST-2", "train", "sentence\tlbl\nfine .\t1\n")
    with pytest.raises(UserError) as exc:
        read_local(TASKS["sst2"], tmp_path, "train")
    assert "'label'" in assert_user_error(exc, path, 1)


def test_missing_gold_label_column(tmp_path: Path) -> None:
    header = MNLI_TRAIN_HEADER.replace("\tgold_label", "")
    path = write(tmp_path, "MNLI", "train", header + mnli_row(0, "a", "b", ["neutral"]))
    with pytest.raises(UserError) as exc:
        read_local(TASKS["mnli"], tmp_path, "train")
    assert "'gold_label'" in assert_user_error(exc, path, 1)


def test_unknown_label(tmp_path: Path) -> None:
    content = "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\tentails\n"
    path = write(tmp_path, "RTE", "dev", content)
    with pytest.raises(UserError) as exc:
        read_local(TASKS["rte"], tmp_path, "dev")
    message = assert_user_error(exc, path, 3)
    assert "'entails'" in message and "entailment, not_entailment" in message


def test_unknown_label_in_headerless_cola(tmp_path: Path) -> None:
    path = write(tmp_path, "CoLA", "dev", "source\tlabel\tstar\tsentence\n")  # a header
    with pytest.raises(UserError) as exc:
        read_local(TASKS["cola"], tmp_path, "dev")
    assert "0, 1" in assert_user_error(exc, path, 1)


@pytest.mark.parametrize(
    ("folder", "name", "content", "line"),
    [
        ("SST-2", "sst2", "sentence\tlabel\n", 2),
        ("SST-2", "sst2", "sentence\tlabel\n\n", 2),
        ("SST-2", "sst2", "", 1),
        ("CoLA", "cola", "", 1),
        ("MRPC", "mrpc", BOM + "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n", 2),
    ],
)
def test_empty_split(tmp_path: Path, folder: str, name: str, content: str, line: int) -> None:
    path = write(tmp_path, folder, "dev", content)
    with pytest.raises(UserError) as exc:
        read_local(TASKS[name], tmp_path, "dev")
    assert_user_error(exc, path, line)


@pytest.mark.parametrize(
    ("folder", "name", "content", "line"),
    [
        (
            "MRPC",
            "mrpc",
            BOM + "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
            "1\t1\t2\ta\tb\n0\t3\t4\tonly one string\n",
            3,
        ),  # fmt: skip
        ("CoLA", "cola", "gj04\t1\t\tfine.\ngj04\t1\tno sentence\n", 2),
        ("SST-2", "sst2", "sentence\tlabel\na\tb\t1\n", 2),
    ],
)
def test_ragged_row(tmp_path: Path, folder: str, name: str, content: str, line: int) -> None:
    path = write(tmp_path, folder, "dev", content)
    with pytest.raises(UserError) as exc:
        read_local(TASKS[name], tmp_path, "dev")
    assert "fields" in assert_user_error(exc, path, line)


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"sentence\tlabel\n\x00\x01\x02\xff\xfe\x00junk\n", 2),
        (b"sentence\tlabel\nfine .\t1\ncaf\xe9 au lait\t0\n", 3),  # latin-1, not UTF-8
        (b"\xff\xd8\xff\xe0 a JPEG, not a TSV", 1),
    ],
)
def test_binary_or_wrong_encoding(tmp_path: Path, content: bytes, line: int) -> None:
    path = write(tmp_path, "SST-2", "train", content)
    with pytest.raises(UserError) as exc:
        read_local(TASKS["sst2"], tmp_path, "train")
    assert "UTF-8" in assert_user_error(exc, path, line)


@pytest.mark.parametrize("score", ["n/a", "", "nan", "inf", "3,5"])
def test_bad_stsb_score(tmp_path: Path, score: str) -> None:
    row = f"1\tg\tf\t2012\t0001\tnone\tnone\ta\tb\t{score}\n"
    good = "0\tg\tf\t2012\t0000\tnone\tnone\ta\tb\t2.5\n"
    path = write(tmp_path, "STS-B", "dev", STSB_HEADER + good + row)
    with pytest.raises(UserError) as exc:
        read_local(TASKS["stsb"], tmp_path, "dev")
    assert "score" in assert_user_error(exc, path, 3)


@pytest.mark.parametrize("var", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_read_hub_offline_fails_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, var: str
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv(var, "1")
    start = time.monotonic()
    with pytest.raises(UserError) as exc:
        read_hub(TASKS["rte"], "dev", glue_dir=tmp_path)
    assert time.monotonic() - start < 5
    message = str(exc.value)
    assert "nyu-mll/glue" in message and var in message
    assert str(tmp_path / "RTE") in message and "--glue-dir" in message


def test_read_hub_unreachable_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")  # nothing listens on port 1
    start = time.monotonic()
    with pytest.raises(UserError, match="cannot connect to 127.0.0.1:1") as exc:
        read_hub(TASKS["sst2"], "train")
    assert time.monotonic() - start < 5
    assert "nyu-mll/glue" in str(exc.value) and "GLUE_DIR" in str(exc.value)


def fake_datasets(monkeypatch: pytest.MonkeyPatch, load_dataset: object) -> None:
    """Stand in for the ``datasets`` package and the hub probe, so no test touches the net."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("aclpipe.data.glue_sources._probe_hub", lambda: None)
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))


def test_read_hub_wraps_load_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def load_dataset(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub\nmore detail")

    fake_datasets(monkeypatch, load_dataset)
    with pytest.raises(UserError) as exc:
        read_hub(TASKS["rte"], "train")
    assert "Couldn't reach" in str(exc.value) and "\n" not in str(exc.value)


def test_read_hub_converts_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    rows = {
        "mnli": [{"premise": "p", "hypothesis": "h", "label": 2, "idx": 0}],
        "stsb": [{"sentence1": "a", "sentence2": "b", "label": 3.8, "idx": 0}],
        "sst2": [{"sentence": "s ", "label": 1, "idx": 0}],
    }

    def load_dataset(hub_id: str, config: str, split: str) -> list[dict]:
        calls.append((hub_id, config, split))
        return rows[config]

    fake_datasets(monkeypatch, load_dataset)
    assert read_hub(TASKS["mnli"], "dev_mismatched") == [Example("p", "h", 2)]
    assert read_hub(TASKS["stsb"], "train", "me/glue") == [Example("a", "b", 3.8)]
    assert read_hub(TASKS["sst2"], "dev") == [Example("s ", None, 1)]
    assert calls == [
        ("nyu-mll/glue", "mnli", "validation_mismatched"),
        ("me/glue", "stsb", "train"),
        ("nyu-mll/glue", "sst2", "validation"),
    ]
    rows["sst2"] = [{"sentence": "unlabelled", "label": -1, "idx": 0}]
    with pytest.raises(UserError, match="row 0"):
        read_hub(TASKS["sst2"], "dev")
