"""The prepare stage: GLUE examples -> tokenized JSONL under data/<task>/.

No padding at rest: each example keeps its own length (``aclpipe.modeling.batching`` pads
each batch to its longest). Reading the prepared files back is ``aclpipe.data.prepared``.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path

from aclpipe import atomic
from aclpipe.data.config import DataConfig
from aclpipe.data.fewshot import draw_fewshot
from aclpipe.data.glue_sources import Example, local_available, read_hub, read_local
from aclpipe.data.phrase_holdout import carve_by_family
from aclpipe.data.prepared import subsample
from aclpipe.data.tasks import Task
from aclpipe.layout import META, VALIDATION, split_file
from aclpipe.modeling.backbone import load_tokenizer

# Tasks whose training rows are phrases of parse trees (SST-2: every phrase of ~6.9k sentences),
# the only ones data.holdout: phrase-family splits by family; sentence and pair tasks (MRPC,
# RTE) have one row per example, so they keep the stratified example split.
PHRASE_ROW_TASKS = frozenset({"sst2"})


def resolve_glue_dir(data: DataConfig, cli_glue_dir: Path | None) -> Path | None:
    """--glue-dir, then the GLUE_DIR environment variable, then data.glue_dir."""
    if cli_glue_dir is not None:
        return cli_glue_dir
    if os.environ.get("GLUE_DIR"):
        return Path(os.environ["GLUE_DIR"])
    return Path(data.glue_dir) if data.glue_dir else None


def split_names(task: Task) -> list[str]:
    return ["train"] + [name for name, _, _ in task.dev_splits]


def carve_validation(
    task: Task, examples: list[Example], fraction: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """``(train, validation)``: ``fraction`` of each label's examples held out, drawn by
    ``seed``; both keep the original order. Regression scores are stratified by quintile.

    Stratifying keeps the validation split's label shares those of train, so a score on it
    is comparable to one on dev; a class with one example stays in train.
    """
    if fraction <= 0:
        return examples, []
    if task.is_regression:
        scores = sorted(float(e.label) for e in examples)
        cuts = [scores[len(scores) * q // 5] for q in range(1, 5)]
        strata = [sum(float(e.label) >= c for c in cuts) for e in examples]
    else:
        strata = [int(e.label) for e in examples]
    by_stratum: dict[int, list[int]] = {}
    for i, stratum in enumerate(strata):
        by_stratum.setdefault(stratum, []).append(i)
    rng = random.Random(seed)
    held: set[int] = set()
    for stratum in sorted(by_stratum):
        members = by_stratum[stratum]
        held.update(rng.sample(members, min(round(fraction * len(members)), len(members) - 1)))
    train = [e for i, e in enumerate(examples) if i not in held]
    validation = [e for i, e in enumerate(examples) if i in held]
    return train, validation


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
    """Read, subsample, tokenize and save every split of ``task``; return the meta record.

    With ``data.validation_fraction`` > 0, that share of train (stratified by label, drawn by
    ``data.seed``, before ``max_train_samples`` subsamples the rest) becomes the validation
    split, ``validation.jsonl``: selection (hyper-parameters, exit thresholds) happens there,
    never on dev. A sentence-embedding task is built by ``aclpipe.data.sentences``.
    """
    if task.embeds:
        from aclpipe.data.sentences import prepare_sentence_task

        return prepare_sentence_task(task, data, model_name, out_dir, glue_dir, trust_remote_code)
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
    if data.validation_fraction > 0:
        meta["validation_fraction"] = data.validation_fraction
    examples = read("train")
    carve = carve_validation
    if data.holdout == "phrase-family" and task.name in PHRASE_ROW_TASKS:  # no family on both sides
        meta["holdout"] = data.holdout
        carve = lambda task, rows, fraction, seed: carve_by_family(rows, fraction, seed)  # noqa: E731
    train, validation = carve(task, examples, data.validation_fraction, data.seed)
    if data.fewshot_examples is not None:  # N drawn from train, no validation split (data.fewshot)
        train, meta["fewshot"] = draw_fewshot(task, examples, train, data)
        validation = []
    splits = {"train": subsample(train, data.max_train_samples, data.seed)}
    if validation:
        splits[VALIDATION] = validation
    for split in split_names(task)[1:]:
        splits[split] = subsample(read(split), data.max_eval_samples, data.seed)
    with atomic.atomic_dir(out_dir) as tmp:
        for split, examples in splits.items():
            rows = tokenize(examples, tokenizer, data.max_length)
            with open(split_file(tmp, split), "w", encoding="utf-8") as f:
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
