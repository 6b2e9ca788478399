"""A trained model as a folder other tools load: transformers, pipelines, sentence-transformers.

``write_hf_folder`` (classification tasks) writes, atomically::

    config.json            AclpipeConfig: the encoder's config, exits, pooling, id2label,
                           label2id, the exit policy; auto_map -> modeling_aclpipe.py
    modeling_aclpipe.py    aclpipe.exits.hf_modeling, verbatim (torch + transformers only)
    model.safetensors      the trained weights under aclpipe's own names
    tokenizer files        as the trained model's tokenizer saves them
    README.md              the model card (aclpipe.exits.model_card)

so that ``AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)``
and ``pipeline("text-classification", model=folder, trust_remote_code=True)`` load it. With
``plain=True`` it writes a stock ``BertForSequenceClassification`` folder instead, no remote
code: possible only for a single-exit model of a BERT encoder pooled by [CLS], whose head is
exactly that class's (pooler ``tanh(W h[CLS] + b)``, dropout, linear). Mean and
layer-attention pooling have no counterpart in the stock classes, which pool [CLS] through
``BertPooler``; extra exits would be dropped silently; so those are refused.

``write_sentence_transformers`` (sentence-embedding tasks, simcse-*) writes the classic
sentence-transformers layout: the encoder at the root (a plain ``AutoModel`` folder),
``1_Pooling`` (mean or cls) and, for cls, ``2_Dense`` holding the trained pooler
(``tanh(W h[CLS] + b)``), so that ``SentenceTransformer(folder)`` gives the embeddings
``aclpipe sts-eval`` scores: the deepest exit's pooled vector.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from aclpipe import atomic
from aclpipe.data.tasks import Task
from aclpipe.errors import UserError
from aclpipe.exits import hf_modeling
from aclpipe.layout import HF_CARD, HF_MODELING, WEIGHTS
from aclpipe.modeling.model import MultiExitModel

PLAIN_FAMILIES = ("bert",)  # encoders whose ForSequenceClassification head is pooler + linear
SAFETENSORS_METADATA = {"format": "pt"}  # transformers reads a file's framework from it
LOADING_FLAGS = ("is_local", "local_files_only", "_commit_hash")  # how it was read, not what it is


def _check_setting(setting: dict, model: MultiExitModel) -> dict:
    policy, threshold = setting.get("policy", "none"), setting.get("threshold")
    if policy not in hf_modeling.EXIT_POLICIES:
        raise UserError(
            f"unknown exit policy {policy!r}: use one of {', '.join(hf_modeling.EXIT_POLICIES)}"
        )
    if model.num_exits == 1:  # one exit: nothing to decide
        policy, threshold = "none", None
    return {"exit_policy": policy, "exit_threshold": threshold}


def encoder_config(model: MultiExitModel) -> dict:
    config = model.encoder.config.to_dict()
    for key in ("_name_or_path", "transformers_version", "architectures", "auto_map"):
        config.pop(key, None)
    return config


def labels_of(task: Task) -> dict:
    """``id2label``, ``label2id`` and ``problem_type`` for ``task`` (one output: regression)."""
    if task.is_regression:
        return {"id2label": {"0": "score"}, "label2id": {"score": 0}, "problem_type": "regression"}
    return {
        "id2label": {str(i): name for i, name in enumerate(task.labels)},
        "label2id": {name: i for i, name in enumerate(task.labels)},
        "problem_type": "single_label_classification",
    }


def _versions() -> str:
    import transformers

    return transformers.__version__


def _save_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(path),
              metadata=SAFETENSORS_METADATA)  # fmt: skip


def multi_exit_config(model: MultiExitModel, task: Task, setting: dict) -> dict:
    spec = model.spec
    return {
        "architectures": ["AclpipeForSequenceClassification"],
        "auto_map": {
            "AutoConfig": f"{HF_MODELING[:-3]}.AclpipeConfig",
            "AutoModelForSequenceClassification": f"{HF_MODELING[:-3]}.AclpipeForSequenceClassification",
        },
        "model_type": hf_modeling.AclpipeConfig.model_type,
        "encoder": encoder_config(model),
        "exits": list(spec.exits),
        "pooling": spec.pooling,
        "cls_from_mean": spec.cls_from_mean,
        "label_embedding": spec.label_embedding,
        **_check_setting(setting, model),
        "patience_eps": 0.1,  # predict's (EarlyExitRuntime's) regression patience eps
        **labels_of(task),
        "dtype": "float32",
        "transformers_version": _versions(),
    }


def plain_refusal(model: MultiExitModel) -> str | None:
    """Why ``model`` has no stock ``BertForSequenceClassification`` folder (None: it has one)."""
    spec, family = model.spec, model.encoder.config.model_type
    if family not in PLAIN_FAMILIES:
        return f"a {family} encoder (only {', '.join(PLAIN_FAMILIES)} maps onto a stock class)"
    if model.num_exits != 1 or spec.exits[-1] != model.num_layers:
        return f"{model.num_exits} exits at layers {spec.exits} (the stock class has one, on top)"
    if spec.pooling != "cls":
        return f"{spec.pooling} pooling (the stock class pools [CLS] through its pooler)"
    return None


def plain_folder(model: MultiExitModel, task: Task) -> tuple[dict, dict[str, torch.Tensor]]:
    """config.json and weights of a stock ``BertForSequenceClassification`` equal to ``model``."""
    why = plain_refusal(model)
    if why is not None:
        raise UserError(
            f"--plain writes a stock BertForSequenceClassification, which cannot hold {why}: "
            "drop --plain (the folder then loads with trust_remote_code=True)"
        )
    state = model.state_dict()
    tensors = {
        f"bert.{k[len('encoder.') :]}": v for k, v in state.items() if k.startswith("encoder.")
    }
    head = "heads.0."
    tensors["bert.pooler.dense.weight"] = state[f"{head}pooler.dense.weight"]
    tensors["bert.pooler.dense.bias"] = state[f"{head}pooler.dense.bias"]
    tensors["classifier.weight"] = state[f"{head}classifier.weight"]
    tensors["classifier.bias"] = state[f"{head}classifier.bias"]
    config = {**encoder_config(model), "architectures": ["BertForSequenceClassification"],
              "classifier_dropout": model.spec.dropout, **labels_of(task),
              "transformers_version": _versions()}  # fmt: skip
    return config, tensors


def write_hf_folder(
    model: MultiExitModel, tokenizer, task: Task, out_dir: Path, setting: dict, card: str,
    plain: bool = False,
) -> dict:  # fmt: skip
    """The transformers folder (module docstring) in ``out_dir``, replaced whole; its config."""
    if task.embeds:
        raise UserError(
            f"{task.name} is a sentence-embedding task: its model has no classifier to export "
            "for transformers (export-hf writes a sentence-transformers folder for it)"
        )
    if plain:
        config, tensors = plain_folder(model, task)
    else:
        config, tensors = multi_exit_config(model, task, setting), model.state_dict()
    with atomic.atomic_dir(out_dir) as tmp:
        _save_weights(tensors, tmp / WEIGHTS)
        save_tokenizer(tokenizer, tmp)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        if not plain:
            (tmp / HF_MODELING).write_text(inspect.getsource(hf_modeling), encoding="utf-8")
        (tmp / HF_CARD).write_text(card, encoding="utf-8")
    return config


def save_tokenizer(tokenizer, folder: Path) -> None:
    """The tokenizer files, without the loading flags transformers 5 writes into
    tokenizer_config.json (``local_files_only`` would follow the folder to the Hub)."""
    tokenizer.save_pretrained(str(folder))
    path = folder / "tokenizer_config.json"
    if path.exists():
        config = json.loads(path.read_text(encoding="utf-8"))
        for key in LOADING_FLAGS:
            config.pop(key, None)
        path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def _module(idx: int, path: str, kind: str) -> dict:
    return {
        "idx": idx,
        "name": str(idx),
        "path": path,
        "type": f"sentence_transformers.models.{kind}",
    }


def write_sentence_transformers(
    model: MultiExitModel, tokenizer, out_dir: Path, card: str, max_length: int = 128
) -> list[dict]:
    """The sentence-transformers folder (module docstring) in ``out_dir``; its modules."""
    spec = model.spec
    if spec.pooling not in ("mean", "cls"):
        raise UserError(
            f"{spec.pooling} pooling has no sentence-transformers module: export-hf writes "
            "sentence-transformers folders for mean and cls pooling (set model.pooling and train "
            "again)"
        )
    if spec.exits[-1] != model.num_layers:
        raise UserError(
            f"the deepest exit is layer {spec.exits[-1]} of {model.num_layers}: "
            "sentence-transformers runs every layer, so export-hf needs an exit on the last"
        )
    state = model.state_dict()
    encoder = {k[len("encoder.") :]: v for k, v in state.items() if k.startswith("encoder.")}
    config = {**encoder_config(model), "architectures": [type(model.encoder).__name__],
              "transformers_version": _versions()}  # fmt: skip
    hidden = model.encoder.config.hidden_size
    modules = [_module(0, "", "Transformer"), _module(1, "1_Pooling", "Pooling")]
    pooling = {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": spec.pooling == "cls",
        "pooling_mode_mean_tokens": spec.pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    with atomic.atomic_dir(out_dir) as tmp:
        _save_weights(encoder, tmp / WEIGHTS)
        save_tokenizer(tokenizer, tmp)
        _json(tmp / "config.json", config)
        _json(tmp / "sentence_bert_config.json", {"max_seq_length": max_length,
                                                  "do_lower_case": False})  # fmt: skip
        _json(tmp / "config_sentence_transformers.json", {"similarity_fn_name": "cosine"})
        _json(tmp / "1_Pooling" / "config.json", pooling)
        if spec.pooling == "cls":  # the trained pooler: tanh(W h[CLS] + b)
            modules.append(_module(2, "2_Dense", "Dense"))
            _json(tmp / "2_Dense" / "config.json", {
                "in_features": hidden, "out_features": hidden, "bias": True,
                "activation_function": "torch.nn.modules.activation.Tanh",
            })  # fmt: skip
            head = f"heads.{model.num_exits - 1}.pooler.dense."
            dense = {"linear.weight": state[f"{head}weight"], "linear.bias": state[f"{head}bias"]}
            _save_weights(dense, tmp / "2_Dense" / WEIGHTS)
        _json(tmp / "modules.json", modules)
        (tmp / HF_CARD).write_text(card, encoding="utf-8")
    return modules


def _json(path: Path, record) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
