"""The prepare stage: GLUE examples -> tokenized JSONL under data/<task>/, and batching.

No padding at rest: each example keeps its own length and batches pad to their longest.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path

import torch

from aclpipe import atomic
from aclpipe.backbone import load_tokenizer
from aclpipe.config import DataConfig
from aclpipe.errors import UserError
from aclpipe.glue_sources import Example, local_available, read_hub, read_local
from aclpipe.tasks import Task

META = "meta.json"


def resolve_glue_dir(data: DataConfig, cli_glue_dir: Path | None) -> Path | None:
    """--glue-dir, then the GLUE_DIR environment variable, then data.glue_dir."""
    if cli_glue_dir is not None:
        return cli_glue_dir
    if os.environ.get("GLUE_DIR"):
        return Path(os.environ["GLUE_DIR"])
    return Path(data.glue_dir) if data.glue_dir else None


def split_names(task: Task) -> list[str]:
    return ["train"] + [name for name, _, _ in task.dev_splits]


def subsample(examples: list[Example], limit: int | None, seed: int) -> list[Example]:
    """A deterministic subsample of ``limit`` examples, in their original order."""
    if limit is None or limit >= len(examples):
        return examples
    keep = sorted(random.Random(seed).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]


def tokenize(examples: list[Example], tokenizer, max_length: int) -> list[dict]:
    """Token ids per example (pairs as pairs), truncated to ``max_length``, unpadded."""
    texts_a = [e.text_a for e in examples]
    texts_b = [e.text_b for e in examples] if examples and examples[0].text_b is not None else None
    encoded = tokenizer(texts_a, texts_b, truncation=True, max_length=max_length)
    rows = []
    for i, example in enumerate(examples):
        row = {"input_ids": encoded["input_ids"][i], "label": example.label}
        if "token_type_ids" in encoded:
            row["token_type_ids"] = encoded["token_type_ids"][i]
        rows.append(row)
    return rows


def prepare(
    task: Task,
    data: DataConfig,
    model_name: str,
    out_dir: Path,
    glue_dir: Path | None,
    trust_remote_code: bool = False,
) -> dict:
    """Read, subsample, tokenize and save every split of ``task``; return the meta record."""
    if glue_dir is not None and local_available(task, glue_dir):
        source = f"local:{glue_dir / task.folder}"
        read = lambda split: read_local(task, glue_dir, split)  # noqa: E731
    else:
        source = f"hub:{data.hub_id}/{task.hub_config}"
        read = lambda split: read_hub(task, split, data.hub_id, glue_dir=glue_dir)  # noqa: E731
    tokenizer = load_tokenizer(model_name, trust_remote_code)
    meta = {
        "task": task.name,
        "source": source,
        "model": model_name,
        "max_length": data.max_length,
        "seed": data.seed,
        "splits": {},
    }
    with atomic.atomic_dir(out_dir) as tmp:
        for split in split_names(task):
            examples = read(split)
            limit = data.max_train_samples if split == "train" else data.max_eval_samples
            examples = subsample(examples, limit, data.seed)
            rows = tokenize(examples, tokenizer, data.max_length)
            with open(tmp / f"{split}.jsonl", "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")
            lengths = [len(r["input_ids"]) for r in rows]
            meta["splits"][split] = {
                "examples": len(rows),
                "mean_tokens": round(sum(lengths) / len(lengths), 2),
                "truncated": sum(n >= data.max_length for n in lengths),
                "labels": _label_distribution(task, examples),
            }
        (tmp / META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return meta


def _label_distribution(task: Task, examples: list[Example]) -> dict:
    if task.is_regression:
        scores = [float(e.label) for e in examples]
        return {"min": min(scores), "max": max(scores), "mean": round(sum(scores) / len(scores), 4)}
    counts = Counter(int(e.label) for e in examples)
    return {task.labels[i]: counts.get(i, 0) for i in range(task.num_labels)}


def load_split(data_dir: Path, split: str) -> list[dict]:
    path = data_dir / f"{split}.jsonl"
    if not path.exists():
        raise UserError(f"{path} not found: run `aclpipe prepare --task {data_dir.name}` first")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def load_meta(data_dir: Path) -> dict:
    path = data_dir / META
    if not path.exists():
        raise UserError(f"{path} not found: run `aclpipe prepare --task {data_dir.name}` first")
    return json.loads(path.read_text(encoding="utf-8"))


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
