"""The sentence-embedding tasks' data, built from local GLUE training files.

``sentences`` (unsupervised SimCSE): every sentence of the SST-2, CoLA, MRPC, RTE and STS-B
training files (both sentences of a pair), stripped, deduplicated in file order.

``sentence-pairs`` (supervised SimCSE): positive pairs from labelled training data:

- STS-B train pairs scored ``>= POSITIVE_MIN_SCORE`` (4: "mostly equivalent" or better);
- MRPC train paraphrases (label 1);
- RTE train entailments (premise, hypothesis).

A hard negative is added to a row where the data gives one for its anchor: an STS-B train
partner of the anchor scored ``<= NEGATIVE_MAX_SCORE`` (1: "not equivalent, on the same topic"
at best), the analogue for STS of SimCSE's NLI contradictions. MRPC's non-paraphrases and
RTE's non-entailments are not used as negatives: MRPC's negatives are near-paraphrases by
construction (sentences of one news cluster, many of which STS would score 3 or more) and
RTE's ``not_entailment`` merges neutral with contradiction. On the real files this gives a
hard negative to few rows (meta.json records how many): the data gives little of it.

Never dev or test: sentences (and pairs with a sentence) that occur in STS-B's dev file or
the STS Benchmark's test file are dropped from train, and the count is recorded. The dev
split of both tasks is STS-B dev with its gold scores. Rows are tokenized one sentence at a
time: ``{"sentences": [ids, ...], "label": 0}`` (train), ``{"sentences": [ids_1, ids_2],
"label": score}`` (dev); ``modeling.batching.collate_sentences`` batches them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from aclpipe import atomic
from aclpipe.data.config import DataConfig
from aclpipe.data.glue_sources import LOCAL_OPTIONS, local_path, read_local
from aclpipe.data.prepared import subsample
from aclpipe.data.sts_pairs import read_scored_pairs
from aclpipe.data.tasks import TASKS, Task
from aclpipe.errors import UserError
from aclpipe.layout import META, split_file
from aclpipe.modeling.backbone import load_tokenizer

UNSUP_SOURCES = ("sst2", "cola", "mrpc", "rte", "stsb")
POSITIVE_MIN_SCORE = 4.0
NEGATIVE_MAX_SCORE = 1.0
STS_TEST = Path("STS-B") / "original" / "sts-test.tsv"  # the STS Benchmark test, gold scores


def held_out_sentences(glue_dir: Path) -> tuple[set[str], list[str]]:
    """Every sentence of STS-B dev and the STS Benchmark test (what train must not hold), and
    the files read."""
    files = [local_path(TASKS["stsb"], glue_dir, "dev"), Path(glue_dir) / STS_TEST]
    held: set[str] = set()
    read = []
    for path in files:
        if path.is_file():
            pairs = read_scored_pairs(path)
            held.update(s.strip() for s in pairs.first + pairs.second)
            read.append(str(path))
    return held, read


def unsup_sentences(glue_dir: Path, held_out: set[str]) -> tuple[list[str], dict]:
    """The unsupervised training sentences (module docstring) and their counts."""
    seen: dict[str, None] = {}
    read = Counter()
    for name in UNSUP_SOURCES:
        for example in read_local(TASKS[name], glue_dir, "train"):
            for text in (example.text_a, example.text_b):
                if text is not None and text.strip():
                    read[name] += 1
                    seen.setdefault(text.strip(), None)
    unique = list(seen)
    kept = [s for s in unique if s not in held_out]
    counts = {
        "read": dict(read),
        "unique": len(unique),
        "in_sts_dev_or_test_dropped": len(unique) - len(kept),
        "kept": len(kept),
    }
    return kept, counts


def sup_rows(glue_dir: Path, held_out: set[str]) -> tuple[list[tuple[str, ...]], dict]:
    """The supervised rows ``(anchor, positive[, hard negative])`` (module docstring)."""
    stsb = read_local(TASKS["stsb"], glue_dir, "train")
    mrpc = read_local(TASKS["mrpc"], glue_dir, "train")
    rte = read_local(TASKS["rte"], glue_dir, "train")
    entailment = TASKS["rte"].labels.index("entailment")
    positives = {
        "stsb": [(e.text_a, e.text_b) for e in stsb if e.label >= POSITIVE_MIN_SCORE],
        "mrpc": [(e.text_a, e.text_b) for e in mrpc if e.label == 1],
        "rte": [(e.text_a, e.text_b) for e in rte if e.label == entailment],
    }
    negatives: dict[str, str] = {}  # anchor -> its first low-scored STS-B partner
    for e in stsb:
        if e.label <= NEGATIVE_MAX_SCORE:
            negatives.setdefault(e.text_a.strip(), e.text_b.strip())
            negatives.setdefault(e.text_b.strip(), e.text_a.strip())
    rows: dict[tuple[str, ...], None] = {}
    counts = {"positive_pairs": {k: len(v) for k, v in positives.items()}}
    dropped_held = 0
    for pairs in positives.values():
        for a, b in pairs:
            a, b = a.strip(), b.strip()
            row = (a, b, negatives[a]) if a in negatives else (a, b)
            if any(s in held_out for s in row):
                dropped_held += 1
                continue
            rows.setdefault(row, None)
    kept = list(rows)
    counts.update(
        in_sts_dev_or_test_dropped=dropped_held,
        duplicate_rows_dropped=sum(map(len, positives.values())) - dropped_held - len(kept),
        rows=len(kept),
        with_hard_negative=sum(len(r) == 3 for r in kept),
    )
    return kept, counts


def prepare_sentence_task(
    task: Task,
    data: DataConfig,
    model_name: str,
    out_dir: Path,
    glue_dir: Path | None,
    trust_remote_code: bool = False,
) -> dict:
    """Build, subsample (``data.max_train_samples``, ``data.max_eval_samples``), tokenize and
    save ``task`` (``sentences`` or ``sentence-pairs``); return the meta record."""
    if glue_dir is None or not all(
        local_path(TASKS[n], glue_dir, s).is_file() for n in UNSUP_SOURCES for s in ("train", "dev")
    ):
        raise UserError(
            f"{task.name} is built from the local GLUE files of {', '.join(UNSUP_SOURCES)} "
            f"(train and dev): none or not all found in {glue_dir}; point to them with "
            f"{LOCAL_OPTIONS}"
        )
    held, held_files = held_out_sentences(glue_dir)
    if task.name == "sentences":
        sentences, counts = unsup_sentences(glue_dir, held)
        train = [(s,) for s in sentences]
    else:
        train, counts = sup_rows(glue_dir, held)
    train = subsample(train, data.max_train_samples, data.seed)
    dev = read_scored_pairs(local_path(TASKS["stsb"], glue_dir, "dev"))
    dev_rows = subsample(
        list(zip(zip(dev.first, dev.second), dev.scores)), data.max_eval_samples, data.seed
    )
    tokenizer = load_tokenizer(model_name, trust_remote_code)
    splits = {
        "train": [(row, 0) for row in train],
        "dev": dev_rows,
    }
    meta = {
        "task": task.name,
        "source": f"local:{glue_dir}",
        "model": model_name,
        "max_length": data.max_length,
        "seed": data.seed,
        "built": counts,
        "held_out_files": held_files,
        "splits": {},
    }
    with atomic.atomic_dir(out_dir) as tmp:
        for split, rows in splits.items():
            encoded = _tokenize([s for sentences, _ in rows for s in sentences], tokenizer, data)
            lengths = [len(ids) for ids in encoded]
            with open(split_file(tmp, split), "w", encoding="utf-8") as f:
                at = 0
                for sentences, label in rows:
                    ids = encoded[at : at + len(sentences)]
                    at += len(sentences)
                    f.write(json.dumps({"sentences": ids, "label": label}) + "\n")
            meta["splits"][split] = {
                "examples": len(rows),
                "sentences": len(encoded),
                "mean_tokens": round(sum(lengths) / max(1, len(lengths)), 2),
                "truncated": sum(n >= data.max_length for n in lengths),
            }
        (tmp / META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return meta


def _tokenize(sentences: list[str], tokenizer, data: DataConfig) -> list[list[int]]:
    if not sentences:
        return []
    return tokenizer(sentences, truncation=True, max_length=data.max_length)["input_ids"]
