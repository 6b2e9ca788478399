"""Text to padded id arrays with the ``tokenizers`` library and NumPy alone (no torch, no
transformers), for ``predict`` on a serving box.

``load_fast_tokenizer`` reads ``tokenizer.json`` (written by ``export-exits``, or the one a
Hugging Face fast tokenizer saves) and sets it up as ``tokenizer(a[, b], truncation=True,
max_length=n)`` of transformers does: no padding, longest-first truncation to ``n`` tokens
counting the special tokens, and the pair template stored in the file's post-processor
(``[CLS] a [SEP] b [SEP]`` with type ids 0 and 1 for BERT). ``pad`` right-pads rows as
``modeling.batching.collate`` does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aclpipe.errors import UserError


def load_fast_tokenizer(path: Path, max_length: int):
    """``tokenizers.Tokenizer`` from ``path``, truncating to ``max_length``, never padding."""
    from tokenizers import Tokenizer

    if not path.is_file():
        raise UserError(
            f"no {path.name} in {path.parent}: export the model again with "
            "`aclpipe export-exits` (it writes the fast tokenizer file)"
        )
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception for a damaged file
        raise UserError(f"{path} is not a tokenizer file ({err}): export the model again") from err
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length, strategy="longest_first", direction="right")
    return tokenizer


def encode(tokenizer, texts: list[tuple[str, str | None]]) -> list[dict]:
    """Unpadded rows ``{"input_ids", "token_type_ids"}`` for sentences or pairs ``(a, b)``."""
    singles = [i for i, (_, b) in enumerate(texts) if b is None]
    pairs = [i for i, (_, b) in enumerate(texts) if b is not None]
    rows: list[dict] = [{} for _ in texts]
    if singles:
        done = tokenizer.encode_batch([texts[i][0] for i in singles])
        for i, enc in zip(singles, done):
            rows[i] = {"input_ids": enc.ids, "token_type_ids": enc.type_ids}
    if pairs:
        done = tokenizer.encode_batch([(texts[i][0], texts[i][1]) for i in pairs])
        for i, enc in zip(pairs, done):
            rows[i] = {"input_ids": enc.ids, "token_type_ids": enc.type_ids}
    return rows


def pad(rows: list[dict], pad_id: int) -> dict[str, np.ndarray]:
    """Right-pad to the longest row: ``input_ids``, ``attention_mask``, ``token_type_ids``,
    each ``[B, T]`` int64."""
    longest = max(len(r["input_ids"]) for r in rows)
    input_ids = np.full((len(rows), longest), pad_id, dtype=np.int64)
    attention_mask = np.zeros((len(rows), longest), dtype=np.int64)
    token_type_ids = np.zeros((len(rows), longest), dtype=np.int64)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        input_ids[i, :n] = row["input_ids"]
        attention_mask[i, :n] = 1
        token_type_ids[i, :n] = row["token_type_ids"]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
    }
