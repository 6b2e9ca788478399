"""Sentence embeddings scored on STS: the cosine similarity of the two sentences of a pair,
ranked against gold similarity scores (Spearman), at every exit of a trained model.

Each sentence is encoded on its own; its embedding at an exit is that exit's pooled feature
``z_k`` (before dropout, in eval mode): the trained pooler, as ``simcse-unsup`` and
``simcse-sup`` trained it (docs/methods.md, Pooling; docs/sentence_embeddings.md).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from aclpipe.evaluation.metrics import compute_metrics
from aclpipe.modeling.batching import collate_sentences
from aclpipe.modeling.model import MultiExitModel


@torch.no_grad()
def exit_pair_cosines(
    model: MultiExitModel,
    rows: list[dict],
    batch_size: int,
    pad_id: int,
    device: torch.device | str = "cpu",
) -> np.ndarray:
    """Cosine similarity of each row's two sentences at every exit, ``[E, N]``.

    ``rows`` are prepared pairs, ``{"sentences": [ids_1, ids_2], ...}``."""
    was_training = model.training
    model.eval()
    cosines = []
    try:
        for start in range(0, len(rows), batch_size):
            batch = collate_sentences(rows[start : start + batch_size], pad_id)
            batch.pop("labels")
            batch = {k: v.to(device) for k, v in batch.items()}
            features = model(**batch).features.float()  # [E, 2b, D], the pairs' rows in turn
            cosines.append(F.cosine_similarity(features[:, 0::2], features[:, 1::2], dim=-1).cpu())
    finally:
        model.train(was_training)
    return torch.cat(cosines, dim=1).double().numpy()  # [E, N]


def spearman(similarity: np.ndarray, gold: np.ndarray) -> float:
    """Spearman correlation of ``similarity [N]`` with ``gold [N]`` (STS-B's metric,
    ``metrics.compute_metrics``; a constant similarity gives 0)."""
    from aclpipe.data.tasks import get_task

    return compute_metrics(get_task("stsb"), similarity, gold)["spearman"]


def exit_spearman(cosines: np.ndarray, gold: np.ndarray) -> list[float]:
    """``spearman`` of each exit's cosines ``[E, N]`` against ``gold [N]``."""
    return [spearman(c, gold) for c in cosines]
