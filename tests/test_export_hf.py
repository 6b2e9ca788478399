"""export-hf on a tiny random BERT: the folder loads in transformers (remote code and plain),
in a pipeline and in sentence-transformers, with predict's labels and logits; the model card;
the exit policy against ``policies.leaves``; the one-line refusals.

Each case saves a model as ``aclpipe finetune`` does, exports it through the stage, loads the
folder with the other library and compares against aclpipe's own engine on the same rows.
"""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from cli_helpers import invoke, ok, tree
from paths import RELATIVE, REPO, at

from aclpipe.data.tasks import get_task
from aclpipe.early_exit.policies import leaves
from aclpipe.early_exit.predict import Predictor
from aclpipe.early_exit.tokens import encode, load_fast_tokenizer, pad
from aclpipe.early_exit.torch_engine import TorchEngine
from aclpipe.errors import UserError
from aclpipe.exits import hf_modeling
from aclpipe.layout import (
    DVC_YAML,
    EXPORT_TOKENIZER,
    HF_CARD,
    HF_MODELING,
    METRICS,
    MODEL_CONFIG,
    PARAMS,
    TOKENIZER,
    WEIGHTS,
)
from aclpipe.method_names import METHOD_NAMES
from aclpipe.modeling.backbone import load_encoder, load_tokenizer, load_tokenizer_from
from aclpipe.modeling.model import ExitSpec, MultiExitModel, load_multi_exit
from aclpipe.stages.export_hf import DATA_KNOBS, TRAIN_KNOBS, export_hf, written_by_export_hf

SENTENCES = [
    "good",
    "the movie was bad .",
    "this film is very very fun and great , the plot and the acting too .",
    "a dog sits on the mat",
    "it was not awful",
]
PAIRS = [("the movie was good .", "the film is fun ."), ("bad plot", "a dog sits on the mat")]


def save_trained(root: Path, tiny_model_dir: Path, task: str, method: str, spec: ExitSpec) -> Path:
    """A model folder as finetune leaves it (weights, config, tokenizer/) under ``root``."""
    torch.manual_seed(0)
    model = MultiExitModel(load_encoder(str(tiny_model_dir)), spec)
    for p in model.heads.parameters():  # heads of a trained model are not at their init
        torch.nn.init.normal_(p, std=0.5)
    folder = at(root).model(task, method)
    model.save(folder, base_model=str(tiny_model_dir))
    load_tokenizer(str(tiny_model_dir)).save_pretrained(str(folder / TOKENIZER))
    return folder


def predict_reference(model_dir: Path, texts: list) -> tuple[np.ndarray, list[dict]]:
    """predict's full-model logits ``[N, C]`` (its torch engine, one padded batch) and its
    output records, for ``texts`` (sentences, or (a, b) pairs)."""
    rows = [(t, None) if isinstance(t, str) else t for t in texts]
    tokenizer = load_fast_tokenizer(model_dir / TOKENIZER / EXPORT_TOKENIZER, 128)
    engine = TorchEngine(model_dir, "none", None)
    logits, _ = engine(pad(encode(tokenizer, rows), engine.pad_id))
    lines = [t if isinstance(t, str) else "\t".join(t) for t in texts]
    records = list(Predictor(model_dir, policy="none", engine="torch").records(lines))
    return logits, records


def hf_logits(folder: Path, texts: list, **load) -> tuple[torch.Tensor, object]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(folder), **load).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), **load)
    a = [t if isinstance(t, str) else t[0] for t in texts]
    b = None if isinstance(texts[0], str) else [t[1] for t in texts]
    batch = tokenizer(a, b, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        return model(**batch), model


SPECS = {  # (task, spec): every pooling, one exit and several, both label embeddings
    "cls-single": ("sst2", dict(exits=[3], pooling="cls")),
    "mean-single": ("sst2", dict(exits=[3], pooling="mean")),
    "layer-attention-single": ("sst2", dict(exits=[3], pooling="layer-attention")),
    "cls-multi": ("sst2", dict(exits=[1, 2, 3], pooling="cls")),
    "mean-multi": ("sst2", dict(exits=[1, 2, 3], pooling="mean")),
    "layer-attention-multi": ("sst2", dict(exits=[1, 2, 3], pooling="layer-attention")),
    "layer-attention-cls-from-mean": (
        "sst2",
        dict(exits=[2, 3], pooling="layer-attention", cls_from_mean=True),
    ),
    "separate-label-table": (
        "sst2",
        dict(exits=[1, 3], pooling="mean", label_embedding="separate"),
    ),
    "mnli-three-labels": ("mnli", dict(exits=[1, 2, 3], pooling="cls")),
    "mrpc-pairs": ("mrpc", dict(exits=[2, 3], pooling="mean")),
    "stsb-regression": ("stsb", dict(exits=[1, 2, 3], pooling="cls")),
}


@pytest.mark.parametrize("case", list(SPECS))
def test_round_trip_matches_predict(case: str, tmp_path: Path, tiny_model_dir: Path, make_params):
    task_name, fields = SPECS[case]
    task = get_task(task_name)
    spec = ExitSpec(num_labels=task.num_labels, dropout=0.1, **fields)
    model_dir = save_trained(tmp_path, tiny_model_dir, task.name, "ce", spec)
    folder = export_hf(task, "ce", make_params(), at(tmp_path))
    texts = PAIRS if task.is_pair else SENTENCES
    expected, records = predict_reference(model_dir, texts)
    out, model = hf_logits(folder, texts, trust_remote_code=True)
    assert type(model).__name__ == "AclpipeForSequenceClassification"
    assert out.logits.shape == expected.shape
    np.testing.assert_allclose(out.logits.numpy(), expected, atol=1e-5, rtol=0)
    assert out.exit_logits.shape[0] == len(spec.exits)
    if not task.is_regression:
        assert out.logits.argmax(-1).tolist() == [r["label"] for r in records]
        names = [model.config.id2label[i] for i in out.logits.argmax(-1).tolist()]
        assert names == [task.labels[r["label"]] for r in records]
        assert model.config.label2id == {n: i for i, n in enumerate(task.labels)}


def test_pipeline_gives_predict_labels(tmp_path: Path, tiny_model_dir: Path, make_params):
    from transformers import pipeline

    spec = ExitSpec(num_labels=2, exits=[1, 2, 3], pooling="mean", dropout=0.1)
    model_dir = save_trained(tmp_path, tiny_model_dir, "sst2", "joint", spec)
    folder = export_hf(get_task("sst2"), "joint", make_params(), at(tmp_path))
    _, records = predict_reference(model_dir, SENTENCES)
    classify = pipeline("text-classification", model=str(folder), trust_remote_code=True)
    answers = classify(SENTENCES)
    assert [a["label"] for a in answers] == [("0", "1")[r["label"]] for r in records]
    np.testing.assert_allclose([a["score"] for a in answers],
                               [r["probability"] for r in records], atol=1e-5)  # fmt: skip


def test_modeling_file_needs_only_torch_and_transformers(tmp_path, tiny_model_dir, make_params):
    spec = ExitSpec(num_labels=2, exits=[3], pooling="cls", dropout=0.1)
    save_trained(tmp_path, tiny_model_dir, "sst2", "ce", spec)
    folder = export_hf(get_task("sst2"), "ce", make_params(), at(tmp_path))
    tree = ast.parse((folder / HF_MODELING).read_text(encoding="utf-8"))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    assert roots == {"__future__", "dataclasses", "torch", "transformers"}
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "local_files_only" not in tokenizer_config and "is_local" not in tokenizer_config
    module = HF_MODELING.removesuffix(".py")
    assert config["auto_map"] == {
        "AutoConfig": f"{module}.AclpipeConfig",
        "AutoModelForSequenceClassification": f"{module}.AclpipeForSequenceClassification",
    }


def reference_exit(policy: str, threshold: float, logits: np.ndarray, eps: float) -> list[int]:
    """The exit index each sample leaves at, by ``policies.leaves`` one exit at a time."""
    regression = logits.shape[-1] == 1
    size = int(threshold) + 1 if policy == "patience" else 1
    chosen = []
    for b in range(logits.shape[1]):
        window: list = []
        for e in range(logits.shape[0]):
            window = (window + [logits[e, b].tolist()])[-size:]
            if e == logits.shape[0] - 1 or leaves(policy, threshold, window, regression, eps):
                chosen.append(e)
                break
    return chosen


@pytest.mark.parametrize(
    "policy,threshold,classes",
    [("entropy", t, 3) for t in (0.0, 0.2, 0.6, 1.09)]
    + [("confidence", t, 2) for t in (0.5, 0.7, 0.95, 1.0)]
    + [("patience", t, c) for t in (1, 2, 3) for c in (2, 1)],
)
def test_exit_decisions_match_the_policies(policy: str, threshold: float, classes: int) -> None:
    generator = torch.Generator().manual_seed(int(threshold * 100) + classes)
    logits = torch.randn(5, 64, classes, generator=generator) * 2  # [E, B, C]
    logits[:, :8] = logits[:1, :8]  # samples whose exits all agree
    exits = [2, 4, 6, 8, 10]
    chosen, layers = hf_modeling.exit_decisions(logits, exits, policy, threshold, eps=0.5)
    expected = reference_exit(policy, threshold, logits.numpy(), 0.5)
    assert layers.tolist() == [exits[e] for e in expected]
    assert torch.equal(chosen, logits[torch.tensor(expected), torch.arange(64)])


def test_exit_policy_is_a_config_field_and_matches_predict(tmp_path, tiny_model_dir, make_params):
    spec = ExitSpec(num_labels=2, exits=[1, 2, 3], pooling="cls", dropout=0.1)
    model_dir = save_trained(tmp_path, tiny_model_dir, "sst2", "joint", spec)
    layout = at(tmp_path)
    curves = {"split": "dev", "points": []}  # no sweep: the export stores the fallback
    layout.report("sst2", "joint").mkdir(parents=True)
    (layout.report("sst2", "joint") / "curves.json").write_text(json.dumps(curves))
    folder = export_hf(get_task("sst2"), "joint", make_params(), layout)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert (config["exit_policy"], config["exit_threshold"]) == ("entropy", 0.3)
    out, model = hf_logits(folder, SENTENCES, trust_remote_code=True)
    for policy, threshold in (("entropy", 0.69), ("confidence", 0.52), ("patience", 1)):
        logits, layers = model.exit_decisions(out.exit_logits, policy, threshold)
        predictor = Predictor(model_dir, policy=policy, threshold=threshold, engine="torch")
        records = list(predictor.records(SENTENCES))
        assert layers.tolist() == [r["exit_layer"] for r in records]
        assert logits.argmax(-1).tolist() == [r["label"] for r in records]


def test_plain_folder_loads_without_remote_code(tmp_path, tiny_model_dir, make_params):
    from transformers import BertForSequenceClassification

    spec = ExitSpec(num_labels=2, exits=[3], pooling="cls", dropout=0.1, label_embedding="separate")
    model_dir = save_trained(tmp_path, tiny_model_dir, "sst2", "ce", spec)
    folder = export_hf(get_task("sst2"), "ce", make_params(), at(tmp_path), plain=True)
    assert not (folder / HF_MODELING).exists()
    assert "auto_map" not in json.loads((folder / "config.json").read_text(encoding="utf-8"))
    expected, records = predict_reference(model_dir, SENTENCES)
    out, model = hf_logits(folder, SENTENCES)
    assert isinstance(model, BertForSequenceClassification)
    np.testing.assert_allclose(out.logits.numpy(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "fields,words",
    [
        (dict(exits=[3], pooling="mean"), "mean pooling"),
        (dict(exits=[3], pooling="layer-attention"), "layer-attention pooling"),
        (dict(exits=[1, 2, 3], pooling="cls"), "3 exits at layers [1, 2, 3]"),
        (dict(exits=[2], pooling="cls"), "1 exits at layers [2]"),
    ],
)
def test_plain_refuses_what_the_stock_class_cannot_hold(
    fields, words, tmp_path, tiny_model_dir, make_params
) -> None:
    save_trained(tmp_path, tiny_model_dir, "sst2", "ce", ExitSpec(2, dropout=0.1, **fields))
    with pytest.raises(UserError, match="cannot hold") as err:
        export_hf(get_task("sst2"), "ce", make_params(), at(tmp_path), plain=True)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert not at(tmp_path).hf_export("sst2", "ce").exists()  # nothing half-written


def card_front_matter(folder: Path) -> tuple[dict, str]:
    text = (folder / HF_CARD).read_text(encoding="utf-8")
    _, head, body = text.split("---\n", 2)
    return yaml.safe_load(head), body


def test_model_card_fields(tmp_path: Path, tiny_model_dir: Path, make_params) -> None:
    spec = ExitSpec(num_labels=2, exits=[1, 2, 3], pooling="mean", dropout=0.1)
    save_trained(tmp_path, tiny_model_dir, "mrpc", "joint", spec)
    layout = at(tmp_path)
    per_exit = [{"layer": k, "metrics": {"accuracy": 0.6 + k / 100, "f1": 0.7 + k / 100},
                 "score": 0.65 + k / 100} for k in (1, 2, 3)]  # fmt: skip
    metrics = {"splits": {"dev": {"examples": 408, "per_exit": per_exit}}}
    layout.report("mrpc", "joint").mkdir(parents=True)
    (layout.report("mrpc", "joint") / METRICS).write_text(json.dumps(metrics))
    params = make_params(train={"lr": 3e-4})
    folder = export_hf(get_task("mrpc"), "joint", params, layout, license="mit")
    meta, body = card_front_matter(folder)
    assert meta["base_model"] == str(tiny_model_dir)
    assert meta["datasets"] == ["nyu-mll/glue"] and meta["license"] == "mit"
    assert meta["pipeline_tag"] == "text-classification"
    assert meta["metrics"] == ["accuracy", "f1"]
    result = meta["model-index"][0]["results"][0]
    assert result["dataset"]["config"] == "mrpc" and result["dataset"]["split"] == "validation"
    assert {m["type"]: m["value"] for m in result["metrics"]} == {"accuracy": 0.63, "f1": 0.73}
    table = [line for line in body.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert table == ["| 1 | 61.00, 71.00 |", "| 2 | 62.00, 72.00 |", "| 3 | 63.00, 73.00 |"]
    assert "| train | lr | 0.0003 |" in body and "| model | pooling | mean |" in body
    assert "trust_remote_code=True" in body


def test_model_card_without_scores_or_local_card(tmp_path, tiny_model_dir, make_params) -> None:
    spec = ExitSpec(num_labels=2, exits=[3], pooling="cls", dropout=0.1)
    save_trained(tmp_path, tiny_model_dir, "sst2", "ce", spec)
    folder = export_hf(get_task("sst2"), "ce", make_params(), at(tmp_path))
    meta, body = card_front_matter(folder)
    assert meta["license"] == "other" and "model-index" not in meta  # no card, no metrics.json
    assert "| 3 | not evaluated |" in body


def st_embeddings(tmp_path, tiny_model_dir, make_params, pooling: str, method: str):
    st = pytest.importorskip("sentence_transformers")
    task = get_task("sentences")
    spec = ExitSpec(num_labels=1, exits=[3], pooling=pooling, dropout=0.1)
    save_trained(tmp_path, tiny_model_dir, task.name, method, spec)
    folder = export_hf(task, method, make_params(), at(tmp_path))
    model = st.SentenceTransformer(str(folder), device="cpu")
    got = model.encode(SENTENCES, convert_to_tensor=True, batch_size=2)
    reference = load_multi_exit(at(tmp_path).model(task.name, method)).eval()
    expected = []
    tokenizer = load_tokenizer(str(tiny_model_dir))
    with torch.no_grad():
        for text in SENTENCES:  # one at a time, no padding: the plain reference
            batch = tokenizer([text], return_tensors="pt")
            expected.append(reference(**batch).features[-1, 0])  # the deepest exit's z
    return folder, got, torch.stack(expected)


@pytest.mark.slow  # importing sentence-transformers takes seconds
@pytest.mark.parametrize("pooling,method", [("mean", "simcse-unsup"), ("cls", "simcse-sup")])
def test_sentence_transformers_folder_gives_the_same_embeddings(
    pooling, method, tmp_path, tiny_model_dir, make_params
) -> None:
    folder, got, expected = st_embeddings(tmp_path, tiny_model_dir, make_params, pooling, method)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    assert [m["path"] for m in modules] == ["", "1_Pooling"] + (
        ["2_Dense"] if pooling == "cls" else []
    )
    meta, _ = card_front_matter(folder)
    assert meta["library_name"] == "sentence-transformers"
    assert meta["pipeline_tag"] == "sentence-similarity"


def test_sentence_transformers_refuses_layer_attention(tmp_path, tiny_model_dir, make_params):
    spec = ExitSpec(num_labels=1, exits=[3], pooling="layer-attention", dropout=0.1)
    save_trained(tmp_path, tiny_model_dir, "sentences", "simcse-unsup", spec)
    with pytest.raises(UserError, match="layer-attention pooling has no sentence-transformers"):
        export_hf(get_task("sentences"), "simcse-unsup", make_params(), at(tmp_path))
    assert not at(tmp_path).hf_export("sentences", "simcse-unsup").exists()


@pytest.mark.parametrize("before", ["absent", "empty", "own", "foreign", "file"])
def test_out_folder_replaced_only_when_it_is_its_own(
    before: str, tmp_path: Path, tiny_model_dir: Path, make_params
) -> None:
    """--out is replaced whole: absent, empty or an earlier export-hf folder are written;
    a folder export-hf did not write, or a file, is refused and left as it was."""
    spec = ExitSpec(2, exits=[3], pooling="cls", dropout=0.1)
    save_trained(tmp_path, tiny_model_dir, "sst2", "ce", spec)
    out = tmp_path / "out"
    if before == "empty":
        out.mkdir()
    elif before == "own":
        export_hf(get_task("sst2"), "ce", make_params(), at(tmp_path), out)
    elif before == "foreign":
        out.mkdir()
        (out / "notes.txt").write_text("mine\n", encoding="utf-8")
    elif before == "file":
        out.write_text("mine\n", encoding="utf-8")
    snapshot = tree(tmp_path)
    if before in ("foreign", "file"):
        with pytest.raises(UserError, match="export-hf did not write|is a file"):
            export_hf(get_task("sst2"), "ce", make_params(), at(tmp_path), out)
        assert tree(tmp_path) == snapshot
    else:
        export_hf(get_task("sst2"), "ce", make_params(), at(tmp_path), out)
        assert written_by_export_hf(out) and (out / HF_MODELING).is_file()


def dvc_stage(name: str) -> dict:
    return yaml.safe_load((REPO / DVC_YAML).read_text(encoding="utf-8"))["stages"][name]


def covered(path: str, deps: list[str]) -> bool:
    return any(path == dep or path.startswith(dep.rstrip("/") + "/") for dep in deps)


def aclpipe_imports(module: str) -> set[str]:
    """The package's source files ``module`` imports, directly or through others (by AST)."""
    src = REPO / "src"

    def file_of(name: str) -> Path | None:
        path = src.joinpath(*name.split("."))
        for candidate in (path / "__init__.py", path.with_suffix(".py")):
            if candidate.is_file():
                return candidate
        return None

    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        file = file_of(name)
        if name in seen or file is None:
            continue
        seen.add(name)
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aclpipe"):
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("aclpipe")]
    return {file_of(name).relative_to(REPO).as_posix() for name in seen}


# what the stage's code imports but cannot change the folder: the package's face, its error
# type, the exits package's docstring
INERT = {"src/aclpipe/__init__.py", "src/aclpipe/errors.py", "src/aclpipe/exits/__init__.py"}


PIPELINE = yaml.safe_load((REPO / PARAMS).read_text(encoding="utf-8"))["pipeline"]
EXPORTED = [(t, m) for t in PIPELINE["tasks"] for m in PIPELINE["export_methods"]]


@pytest.mark.parametrize("task,method", EXPORTED)
def test_dvc_stage_agrees_with_the_cli(task: str, method: str, monkeypatch) -> None:
    """dvc.yaml's export-hf stage: the exported methods (export-exits' matrix); a command the
    CLI takes, which writes the layout's folder, the stage's one output; as dependencies the
    files the stage reads (by the layout), every source file its code imports and the params
    its card shows."""
    from aclpipe.stages import export_hf as stage_module

    stage = dvc_stage("export-hf")
    assert stage["matrix"] == dvc_stage("export-exits")["matrix"]

    def fill(text: str) -> str:
        return text.replace("${item.task}", task).replace("${item.method}", method)

    calls = []
    monkeypatch.setattr(stage_module, "export_hf", lambda *a: calls.append(a) or Path())
    monkeypatch.chdir(REPO)
    command = shlex.split(fill(stage["cmd"]))
    assert command[0] == "aclpipe"
    ok(*command[1:])
    ((chosen, name, _, layout, out, plain, _),) = calls
    assert (chosen.name, name, out, plain) == (task, method, None, False)
    assert [fill(o) for o in stage["outs"]] == [layout.hf_export(task, method).as_posix()]
    deps = [fill(d) for d in stage["deps"]]
    model, report = RELATIVE.model(task, method), RELATIVE.report(task, method)
    reads = {model / WEIGHTS, model / MODEL_CONFIG, model / TOKENIZER,
             RELATIVE.export(task, method), report / METRICS}  # fmt: skip
    assert {d for d in deps if not d.startswith("src/")} == {p.as_posix() for p in reads}
    assert all((REPO / d).exists() for d in deps if d.startswith("src/"))
    code = aclpipe_imports("aclpipe.stages.export_hf") - INERT
    assert [f for f in sorted(code) if not covered(f, deps)] == []
    knobs = {f"train.{k}" for k in TRAIN_KNOBS} | {f"data.{k}" for k in DATA_KNOBS}
    assert set(map(fill, stage["params"])) == {f"methods.{method}"} | knobs


def test_cli_one_line_errors(tmp_path: Path, monkeypatch, params_dict) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params_dict()), encoding="utf-8")
    cases = [
        (["--task", "sst2", "--method", "joint"], f"missing {MODEL_CONFIG}"),
        (["--task", "sst2", "--method", "ce,joint", "--out", "x"], "--out names one folder"),
        (["--task", "sentences", "--method", "simcse-unsup", "--plain"], "drop --plain"),
    ]
    for args, words in cases:
        result = invoke("export-hf", *args)
        assert result.exit_code == 2, result.output
        assert words in result.output and result.output.count("\n") == 1, result.output
        assert "Traceback" not in result.output


CLASSIFIERS = [m for m in METHOD_NAMES if not m.startswith("simcse")]


@pytest.mark.slow  # trains every method on the tiny model, then exports each through the CLI
def test_every_method_trained_exported_and_loaded(tmp_path: Path, make_project, monkeypatch):
    project = make_project(tmp_path / "project", pipeline={"tasks": ["sst2"]},
                           model={"pooling": "cls"})  # fmt: skip
    monkeypatch.chdir(project)
    ok("finetune", "--task", "sst2", "--method", ",".join(CLASSIFIERS))
    ok("export-hf", "--task", "sst2", "--method", ",".join(CLASSIFIERS))
    for method in CLASSIFIERS:
        model_dir = at(project).model("sst2", method)
        expected, records = predict_reference(model_dir, SENTENCES)
        out, model = hf_logits(at(project).hf_export("sst2", method), SENTENCES,
                               trust_remote_code=True)  # fmt: skip
        np.testing.assert_allclose(out.logits.numpy(), expected, atol=1e-5, rtol=0)
        assert out.logits.argmax(-1).tolist() == [r["label"] for r in records], method
        assert model.config.exits == load_multi_exit(model_dir).spec.exits


@pytest.mark.slow  # trains both sentence-embedding methods, imports sentence-transformers
@pytest.mark.parametrize("task,method", [("sentences", "simcse-unsup"),
                                         ("sentence-pairs", "simcse-sup")])  # fmt: skip
def test_sentence_methods_trained_exported_and_loaded(task, method, tmp_path, params_dict,
                                                      monkeypatch):  # fmt: skip
    st = pytest.importorskip("sentence_transformers")
    from test_sentence_embeddings import write_glue

    raw = params_dict(write_glue(tmp_path / "glue"), train={"batch_size": 4},
                      model={"pooling": "mean"})  # fmt: skip
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    ok("prepare", "--task", task)
    ok("finetune", "--task", task, "--method", method)
    ok("export-hf", "--task", task, "--method", method)
    reference = load_multi_exit(at(tmp_path).model(task, method)).eval()
    tokenizer = load_tokenizer_from(at(tmp_path).model(task, method))
    got = st.SentenceTransformer(str(at(tmp_path).hf_export(task, method)), device="cpu").encode(
        SENTENCES, convert_to_tensor=True
    )
    with torch.no_grad():
        expected = torch.stack([reference(**tokenizer([t], return_tensors="pt")).features[-1, 0]
                                for t in SENTENCES])  # fmt: skip
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
