"""Batching: tokenized rows (unpadded) -> right-padded tensors, for training and inference."""

from __future__ import annotations

import torch


def collate(rows: list[dict], pad_id: int, regression: bool) -> dict[str, torch.Tensor]:
    """Pad a list of tokenized rows to the batch's longest -> tensors ``[B, T]`` and ``[B]``."""
    longest = max(len(r["input_ids"]) for r in rows)
    input_ids = torch.full((len(rows), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)
    has_types = "token_type_ids" in rows[0]
    token_type_ids = torch.zeros((len(rows), longest), dtype=torch.long) if has_types else None
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        input_ids[i, :n] = torch.tensor(row["input_ids"])
        attention_mask[i, :n] = 1
        if token_type_ids is not None:
            token_type_ids[i, :n] = torch.tensor(row["token_type_ids"])
    labels = torch.tensor(
        [r["label"] for r in rows], dtype=torch.float if regression else torch.long
    )
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    if token_type_ids is not None:
        batch["token_type_ids"] = token_type_ids
    return batch


def collate_sentences(rows: list[dict], pad_id: int, views: int = 1) -> dict[str, torch.Tensor]:
    """Pad the sentences of sentence-task rows (``{"sentences": [ids, ...]}``) into one batch.

    Each row's sentences come consecutively, ``views`` times over (``[a, p, a, p]`` for a pair
    at 2 views): ``input_ids [S, T]``, ``attention_mask [S, T]``, and ``labels [B]``, each
    row's number of encodings (``len(sentences) * views``), which is how a sentence objective
    finds its rows in the features (row-major, so gathering over processes keeps rows whole).
    Each sentence is encoded alone (token type 0 throughout).
    """
    flat = [{"input_ids": ids} for row in rows for _ in range(views) for ids in row["sentences"]]
    batch = collate([{**r, "label": 0} for r in flat], pad_id, regression=False)
    batch.pop("token_type_ids", None)
    batch["labels"] = torch.tensor([len(row["sentences"]) * views for row in rows])
    return batch
