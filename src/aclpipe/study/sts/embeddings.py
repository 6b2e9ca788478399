"""Zero-shot sentence embeddings per layer: Spearman correlation on the STS-B dev split.

The layer-attention paper's setting (Oh et al., COLING 2022; docs/methods.md, Pooling): each
sentence of a pair is encoded on its own, pooled into one vector per layer, and the cosine
similarity of the two vectors is ranked against the gold similarity scores. Nothing is
trained here, so every pooling must be parameter-free:

- ``cls``: the raw [CLS] vector of ``h_k`` (no ``tanh(W h + b)`` pooler: an exit's pooler is
  trained, and the checkpoint's own pooler, where it has one, belongs only to the last layer);
- ``mean``: the masked mean of ``h_k`` over tokens;
- ``layer-attention``: ``pooling.parameter_free_layer_attention`` over ``h_0..h_k``, that is,
  the layer-wise attention with identity maps for queries, keys and values and no output
  map; on a mean-pooled checkpoint (all-MiniLM-L6-v2) masked means stand in for [CLS]
  vectors, as in training (``backbone.default_pooling``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.table import Table

from aclpipe import atomic
from aclpipe.data.glue_sources import local_available, read_hub, read_local
from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.evaluation.metrics import compute_metrics
from aclpipe.modeling.backbone import default_pooling, load_encoder, load_tokenizer, resolve_model
from aclpipe.modeling.pooling import masked_mean, parameter_free_layer_attention

POOLINGS = ("cls", "mean", "layer-attention")


def layer_embeddings(
    hidden: tuple[torch.Tensor, ...] | list[torch.Tensor],
    mask: torch.Tensor,
    pooling: str,
    cls_from_mean: bool = False,
) -> torch.Tensor:
    """Parameter-free embeddings at layers ``1..L`` from ``hidden = [h_0, ..., h_L]``.

    Returns ``[L, B, H]``; row ``k-1`` uses ``h_0..h_k`` only.
    """
    layers = range(1, len(hidden))
    if pooling == "cls":
        pooled = [hidden[k][:, 0] for k in layers]
    elif pooling == "mean":
        pooled = [masked_mean(hidden[k], mask) for k in layers]
    elif pooling == "layer-attention":
        pooled = [
            parameter_free_layer_attention(list(hidden[: k + 1]), mask, cls_from_mean)
            for k in layers
        ]
    else:
        raise UserError(f"unknown pooling {pooling!r}: use {', '.join(POOLINGS)}")
    return torch.stack(pooled)  # [L, B, H]


def cosine_spearman(first: np.ndarray, second: np.ndarray, gold: np.ndarray) -> float:
    """Spearman correlation of ``cos(first[i], second[i])`` with ``gold[i]``.

    ``first`` and ``second`` are ``[N, H]``, ``gold`` is ``[N]``. A constant similarity
    (e.g. a collapsed layer) gives 0, as in ``metrics``.
    """
    cosine = F.cosine_similarity(torch.as_tensor(first), torch.as_tensor(second), dim=-1)  # [N]
    return spearman(cosine.double().numpy(), gold)


def spearman(similarity: np.ndarray, gold: np.ndarray) -> float:
    """STS-B's Spearman metric (``metrics.compute_metrics``) of ``similarity [N]`` vs ``gold``."""
    return compute_metrics(get_task("stsb"), similarity, gold)["spearman"]


@torch.no_grad()
def _pair_cosines(
    encoder,
    tokenizer,
    first: list[str],
    second: list[str],
    poolings,
    max_length,
    cls_from_mean: bool,
    device: str,
) -> torch.Tensor:
    """Cosine of the two sentences' embeddings per pooling and layer, ``[P, L, B]``."""
    pooled = []
    for texts in (first, second):
        batch = tokenizer(
            texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        ).to(device)
        hidden = encoder(**batch, output_hidden_states=True).hidden_states  # L+1 x [B, T, H]
        mask = batch["attention_mask"]  # [B, T]
        pooled.append(
            torch.stack(
                [layer_embeddings(hidden, mask, p, cls_from_mean) for p in poolings]
            ).float()
        )  # [P, L, B, H]
    return F.cosine_similarity(pooled[0], pooled[1], dim=-1)  # [P, L, B]


def sts_embedding_eval(
    model_name: str,
    glue_dir: Path | None,
    hub_id: str = "nyu-mll/glue",
    poolings: tuple[str, ...] | list[str] = POOLINGS,
    max_length: int = 128,
    batch_size: int = 64,
    device: str = "cpu",
) -> dict:
    """Spearman x cosine on STS-B dev, for each pooling and each layer ``1..L`` of the encoder.

    Args:
        model_name: a model folder or hub id (``backbone.resolve_model``).
        glue_dir: the classic ``glue_data`` folder; when it lacks STS-B, the hub is read.
        hub_id: the hub dataset to fall back on.
        poolings: any of ``cls``, ``mean``, ``layer-attention`` (module docstring).
        max_length: tokens per sentence (longer ones are truncated).
        batch_size: sentence pairs per forward pass.
        device: where the encoder runs.

    Returns:
        ``{"model", "split": "dev", "examples", "layers": [1..L],
        "layer_attention_query": "cls" | "mean", "spearman": {pooling: [value per layer]}}``.
    """
    poolings = list(poolings)
    unknown = [p for p in poolings if p not in POOLINGS]
    if unknown or not poolings:
        raise UserError(f"unknown pooling(s) {unknown}: use some of {', '.join(POOLINGS)}")
    task = get_task("stsb")
    if local_available(task, glue_dir):
        examples = read_local(task, glue_dir, "dev")
    else:
        examples = read_hub(task, "dev", hub_id, glue_dir=glue_dir)
    cls_from_mean = default_pooling(resolve_model(model_name)) == "mean"
    tokenizer = load_tokenizer(model_name)
    encoder = load_encoder(model_name).to(device).eval()

    cosines = []  # per batch: [P, L, B]
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        cosines.append(
            _pair_cosines(
                encoder,
                tokenizer,
                [e.text_a for e in chunk],
                [e.text_b for e in chunk],
                poolings,
                max_length,
                cls_from_mean,
                device,
            ).cpu()
        )
    similarity = torch.cat(cosines, dim=-1).double().numpy()  # [P, L, N]
    gold = np.array([e.label for e in examples], dtype=np.float64)  # [N]
    num_layers = similarity.shape[1]
    return {
        "model": model_name,
        "split": "dev",
        "examples": len(examples),
        "layers": list(range(1, num_layers + 1)),
        "layer_attention_query": "mean" if cls_from_mean else "cls",
        "spearman": {
            p: [spearman(similarity[i, k], gold) for k in range(num_layers)]
            for i, p in enumerate(poolings)
        },
    }


def render_sts_table(result: dict) -> Table:
    """One row per layer, one column per pooling: Spearman x100."""
    table = Table(
        title=f"{result['model']}: STS-B {result['split']} ({result['examples']} pairs),"
        " Spearman x100 of cosine, zero-shot"
    )
    table.add_column("layer", justify="right")
    poolings = list(result["spearman"])
    for p in poolings:
        table.add_column(p, justify="right")
    num_layers = len(result["spearman"][poolings[0]])
    for k in range(num_layers):
        cells = [f"{100 * result['spearman'][p][k]:.2f}" for p in poolings]
        table.add_row(str(k + 1), *cells)
    return table


def write_sts_report(result: dict, out_path: Path) -> None:
    """Write ``result`` as JSON to ``out_path``, atomically."""
    atomic.write_text(Path(out_path), json.dumps(result, indent=2) + "\n")
