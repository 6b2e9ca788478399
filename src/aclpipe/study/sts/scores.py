"""STS scores of a checkpoint and of a trained sentence-embedding model, on STS-B dev and on
the STS Benchmark test (gold scores), per pooling and per layer.

``aclpipe sts-eval`` and the STS study (``study.sts_study``) call :func:`sts_scores`. For
the checkpoint (``model.name``, or the base model a trained model was trained from) every
pooling is the parameter-free one of ``study.sts_eval`` at every layer (zero-shot). For a
trained model (``--model-dir``, written by ``aclpipe finetune`` with simcse-unsup or
simcse-sup) the score of its own trained pooling at its exit is added (``trained``), and the
parameter-free poolings at every layer of its trained encoder (``encoder_layers``), so that
a figure can show Spearman per layer before and after training.

Every input is checked before the first forward pass (a pair file without gold scores, a
score outside 0 to 5, a pooling the model cannot give), so bad input writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from aclpipe.data.sts_pairs import ScoredPairs, read_scored_pairs
from aclpipe.errors import UserError
from aclpipe.evaluation.sentence_scores import spearman
from aclpipe.modeling.backbone import default_pooling, load_encoder, load_tokenizer, resolve_model
from aclpipe.study.sts.embeddings import POOLINGS, layer_embeddings

SPLITS = ("dev", "test")


@dataclass
class StsCosines:
    """Per-pair cosines behind a result (what the study's bootstrap resamples)."""

    zero_shot: dict[str, np.ndarray]  # split -> [P, L, N]
    encoder_layers: dict[str, np.ndarray]  # split -> [P, L, N] (trained model only)
    trained: dict[str, np.ndarray]  # split -> [N] (trained model only)
    gold: dict[str, np.ndarray]  # split -> [N]


def default_pair_files(glue_dir: Path | None) -> dict[str, Path | None]:
    """STS-B dev (GLUE's file) and the STS Benchmark test with gold scores, under glue_dir."""
    if glue_dir is None:
        return {"dev": None, "test": None}
    return {
        "dev": Path(glue_dir) / "STS-B" / "dev.tsv",
        "test": Path(glue_dir) / "STS-B" / "original" / "sts-test.tsv",
    }


def read_pair_files(files: dict[str, Path | None]) -> dict[str, ScoredPairs]:
    """Every split's scored pairs; a missing file is one line naming it and the option."""
    pairs = {}
    for split in SPLITS:
        path = files.get(split)
        if path is None or not Path(path).is_file():
            raise UserError(
                f"no STS {split} file at {path}: give --{split}-file, or --glue-dir holding "
                "STS-B/dev.tsv and STS-B/original/sts-test.tsv"
            )
        pairs[split] = read_scored_pairs(Path(path))
    return pairs


def check_poolings(poolings: list[str], trained_pooling: str | None, model_dir: Path | None):
    """Known poolings, and for a trained model only the one its pooler was trained for."""
    unknown = [p for p in poolings if p not in POOLINGS]
    if unknown or not poolings:
        raise UserError(f"unknown pooling(s) {unknown}: use some of {', '.join(POOLINGS)}")
    if trained_pooling is not None and poolings != [trained_pooling]:
        other = [p for p in poolings if p != trained_pooling]
        raise UserError(
            f"{model_dir} was trained with {trained_pooling} pooling and cannot give "
            f"{', '.join(other) or 'several'} (its pooler is trained for {trained_pooling} "
            f"only): pass --pooling {trained_pooling} or leave --pooling out"
        )


@torch.no_grad()
def _hidden(encoder, tokenizer, texts: list[str], max_length: int, device: str):
    batch = tokenizer(
        texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
    ).to(device)
    batch.pop("token_type_ids", None)  # each sentence alone: token type 0 throughout
    hidden = encoder(**batch, output_hidden_states=True).hidden_states  # L+1 x [B, T, H]
    return list(hidden), batch["attention_mask"]


@torch.no_grad()
def _split_cosines(encoder, tokenizer, pairs: ScoredPairs, head, cls_from_mean, settings):
    """``([P, L, N] parameter-free cosines, [N] trained-head cosines or None)``."""
    max_length, batch_size, device = settings
    per_layer, trained = [], []
    for start in range(0, len(pairs), batch_size):
        embedded = []
        for texts in (pairs.first, pairs.second):
            hidden, mask = _hidden(
                encoder, tokenizer, texts[start : start + batch_size], max_length, device
            )
            layers = torch.stack(
                [layer_embeddings(hidden, mask, p, cls_from_mean) for p in POOLINGS]
            ).float()  # [P, L, b, H]
            own = None if head is None else head.pool(hidden[: head.layer + 1], mask).float()
            embedded.append((layers, own))
        (first, first_own), (second, second_own) = embedded
        per_layer.append(F.cosine_similarity(first, second, dim=-1).cpu())  # [P, L, b]
        if head is not None:
            trained.append(F.cosine_similarity(first_own, second_own, dim=-1).cpu())  # [b]
    layers = torch.cat(per_layer, dim=-1).double().numpy()
    return layers, (torch.cat(trained).double().numpy() if head is not None else None)


def sts_scores(
    model_name: str,
    pair_files: dict[str, Path | None],
    model_dir: Path | None = None,
    poolings: list[str] | None = None,
    max_length: int = 128,
    batch_size: int = 64,
    device: str = "cpu",
    zero_shot: bool = True,
) -> tuple[dict, StsCosines]:
    """Spearman x cosine on STS-B dev and the STS Benchmark test (module docstring).

    Args:
        model_name: the checkpoint scored zero-shot (ignored with ``model_dir``: the trained
            model's own base model is the checkpoint then).
        pair_files: ``{"dev": path, "test": path}`` of scored pairs (``data.sts_pairs``).
        model_dir: a trained sentence-embedding model folder, or None (zero-shot only).
        poolings: the poolings to report; with ``model_dir`` only its own (the default).
        max_length, batch_size, device: tokens per sentence, pairs per pass, where to run.
        zero_shot: also score the checkpoint itself (the STS study scores it once, apart).

    Returns:
        ``(result, cosines)``: the JSON-ready result and the per-pair cosines behind it.
    """
    model = None
    if model_dir is not None:
        from aclpipe.modeling.model import load_multi_exit

        model = load_multi_exit(Path(model_dir))
        model_name = model.base_model or model_name
        poolings = poolings or [model.spec.pooling]
        check_poolings(poolings, model.spec.pooling, model_dir)
    else:
        poolings = poolings or list(POOLINGS)
        check_poolings(poolings, None, None)
    pairs = read_pair_files(pair_files)  # before any model runs: bad files write nothing
    cls_from_mean = default_pooling(resolve_model(model_name)) == "mean"
    settings = (max_length, batch_size, device)
    gold = {s: np.asarray(p.scores, dtype=np.float64) for s, p in pairs.items()}
    cosines = StsCosines({}, {}, {}, gold)
    tokenizer = load_tokenizer(model_name)
    if zero_shot:
        encoder = load_encoder(model_name).to(device).eval()
        for split, split_pairs in pairs.items():
            cosines.zero_shot[split], _ = _split_cosines(
                encoder, tokenizer, split_pairs, None, cls_from_mean, settings
            )
    if model is not None:
        model.to(device).eval()  # its tokenizer/ is the base model's, loaded above
        for split, split_pairs in pairs.items():
            layers, own = _split_cosines(
                model.encoder, tokenizer, split_pairs, model.heads[-1], cls_from_mean, settings
            )
            cosines.encoder_layers[split], cosines.trained[split] = layers, own
    chosen = [POOLINGS.index(p) for p in poolings]

    def table(per_split: dict[str, np.ndarray]) -> dict:
        return {
            split: {POOLINGS[i]: [spearman(c, gold[split]) for c in values[i]] for i in chosen}
            for split, values in per_split.items()
        }

    num_layers = next(iter({**cosines.zero_shot, **cosines.encoder_layers}.values())).shape[1]
    result = {
        "model": model_name,
        "layers": list(range(1, num_layers + 1)),
        "layer_attention_query": "mean" if cls_from_mean else "cls",
        "pairs": {s: {"file": p.path, "examples": len(p)} for s, p in pairs.items()},
    }
    if zero_shot:
        result["zero_shot"] = table(cosines.zero_shot)
    if model is not None:
        result["trained"] = {
            "model_dir": str(model_dir),
            "pooling": model.spec.pooling,
            "exit": model.spec.exits[-1],
            "spearman": {s: spearman(c, gold[s]) for s, c in cosines.trained.items()},
        }
        result["encoder_layers"] = table(cosines.encoder_layers)
    return result, cosines


def render_sts_scores(result: dict):
    """One row per layer (Spearman x100, dev / test), a column per pooling: the checkpoint
    zero-shot and, for a trained model, its encoder's layers; then the trained pooling."""
    from rich.table import Table

    table = Table(
        title=f"{result['model']}: Spearman x100 of cosine, STS-B dev / STS Benchmark test "
        f"({result['pairs']['dev']['examples']} / {result['pairs']['test']['examples']} pairs)"
    )
    table.add_column("layer", justify="right")
    blocks = [("zero-shot", result["zero_shot"])] if "zero_shot" in result else []
    if "encoder_layers" in result:
        blocks.append(("trained encoder", result["encoder_layers"]))
    for label, block in blocks:
        for pooling in block["dev"]:
            table.add_column(f"{label} {pooling}", justify="right")
    for k, layer in enumerate(result["layers"]):
        cells = [
            f"{100 * block['dev'][p][k]:.2f} / {100 * block['test'][p][k]:.2f}"
            for _, block in blocks
            for p in block["dev"]
        ]
        table.add_row(str(layer), *cells)
    if "trained" in result:
        t = result["trained"]
        spearmans = t["spearman"]
        table.caption = (
            f"trained {t['pooling']} pooling at layer {t['exit']} ({t['model_dir']}): "
            f"{100 * spearmans['dev']:.2f} / {100 * spearmans['test']:.2f}"
        )
    return table


def run_sts_eval(
    model_name: str,
    data,
    glue_dir: Path | None,
    poolings: list[str] | None,
    model_dir: Path | None,
    dev_file: Path | None,
    test_file: Path | None,
    batch_size: int,
    out: Path,
    console,
) -> dict:
    """``aclpipe sts-eval``: score the checkpoint (and ``model_dir``'s trained pooling) on the
    pair files, print the table, write the JSON report to ``out``; bad input writes nothing."""
    from aclpipe.stages.prepare import resolve_glue_dir
    from aclpipe.study.sts.embeddings import write_sts_report

    files = default_pair_files(resolve_glue_dir(data, glue_dir))
    files.update({k: v for k, v in (("dev", dev_file), ("test", test_file)) if v is not None})
    result, _ = sts_scores(model_name, files, model_dir, poolings, data.max_length, batch_size)
    console.print(render_sts_scores(result))
    write_sts_report(result, out)
    console.print(f"wrote {out}", highlight=False)
    return result
