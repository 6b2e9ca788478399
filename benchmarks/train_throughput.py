"""Training throughput of our loop against the Hugging Face Trainer, side by side in one run.

Same model (MiniLM-L6, resolved offline), same data (a fixed, deterministic subset of real
SST-2 train), same batch size, same optimiser settings, one epoch, CPU. Six contenders:

- ``ours``: ``aclpipe.stages.finetune.finetune`` (the loop itself), method ``ce``, on a data folder written by
  ``aclpipe.stages.prepare`` (no padding at rest; ``collate`` pads each batch to its longest),
  rows in a plain shuffle (``train.group_by_length: false``).
- ``ours`` and ``ours-grouped`` run padding-free (``train.padding_free: true``, the default
  ``auto`` on MiniLM: the linear layers skip padded positions, ``aclpipe.modeling.padding_free``);
  ``ours-padded`` is ``ours`` with ``train.padding_free: false``, the arithmetic the Trainer does.
  Their batch widths ("batch T") are the padded widths ``collate`` builds in every case.
- ``ours-grouped``: the same with ``train.group_by_length: true``: batches of rows of similar
  length (``aclpipe.training.batch_order``).
- ``trainer-fixed``: ``transformers.Trainer`` with every example padded to 128 tokens by the
  tokenizer (``padding="max_length"``), the early-exit papers' run_glue default.
- ``trainer-dynamic``: the same Trainer with ``DataCollatorWithPadding`` (pads per batch).
- ``trainer-grouped``: the dynamic Trainer with its own length grouping,
  ``TrainingArguments(train_sampling_strategy="group_by_length")`` (transformers 5's name for
  the old ``group_by_length=True``; its ``LengthGroupedSampler`` draws its own shuffle).

``--contenders`` runs a subset (the targets whose two sides ran are checked); trainer-fixed
alone takes longer than the other four together.

What is timed, the same window for all of them: from the moment the loop starts taking batches
to the end of its last optimiser step, so data loading, collation, forward, loss, backward,
clipping, optimiser and scheduler steps and per-step logging are inside, and everything a
training run does once (loading weights, optimiser and accelerate set-up, ours' dev evaluation
and checkpoint writes) is outside. For ours the window is read from the loop's own progress
hooks (``TrainProgress.start`` to the last ``TrainProgress.step``; the loop logs no
timestamps, so the benchmark passes ``finetune`` a subclass that records them, and a wrapper
around ``collate`` that records batch widths); for the Trainer from a callback
(``on_train_begin`` to the last ``on_step_end``, the window of its own
``train_samples_per_second``). The whole call is timed too and reported beside it, from
loading the weights to a trained model: ``finetune()`` for ours, less the time its dev
evaluation took (the Trainer does none here), but with saving the model twice (checkpoint and
output);
``from_pretrained`` + ``Trainer(...)`` + ``trainer.train()`` for the Trainer, which saves
nothing.

``ours``, ``trainer-fixed`` and ``trainer-dynamic`` train on the same batches in the same order:
the Trainer gets the examples in the order our loop's seeded plain shuffle
(``aclpipe.training.batch_order.epoch_order``) takes them, and reads them sequentially. With dynamic padding a batch costs in proportion to its longest example, so two
different shuffles of ten batches differ by a few percent in padded tokens; with one seed
for every round that luck would not average out, and at a 1.0x target it decides the
verdict. The benchmark checks that ours and the dynamic Trainer padded every batch to the
same width (``same_batches``).

The runs go round-robin (ours, ours-grouped, fixed, dynamic, grouped, ours, ...) for
``--repeats`` rounds after one untimed warm-up round on two batches, so each round's runs see
the same machine load. Round ``r`` trains every contender with seed ``--seed + r - 1``: the
ratios are medians over shuffles, not one shuffle's luck, and ours' dev scores (the last
exit's on ``--eval-samples`` dev examples, after the epoch) differ by seed as much as seeds
make them differ, which is the noise that grouping's dev score is compared against (the
``dev_scores`` section: per seed, plain and grouped, and the binomial standard error of one
score).
A ratio is the median over rounds of that round's ours/Trainer samples/s (absolute figures
drift on a shared machine; side-by-side ratios do not). The Trainer's own
``train_samples_per_second`` is kept in the JSON as a cross-check of its window.

All of them run on one intra-op thread by default (``--threads``). On a shared 2-core machine,
torch's default of one thread per core makes every op wait at a barrier for a thread the
neighbours' jobs have descheduled: a step measured here took ~7x longer on two threads than
on one, and what that measures is the neighbours, not the loop. ``--threads 0`` keeps
torch's default for a quiet machine. On one thread the process's CPU time in the window is
what the loop cost, however often the core was taken away (cache sharing aside), so samples
per CPU-second is printed beside samples/s as a cross-check of the ratios that contention
moves much less.

Usage (from the repository root)::

    python benchmarks/train_throughput.py [--samples 320] [--batch-size 32] [--repeats 3]
        [--eval-samples 872] [--contenders ours,ours-grouped,...]
        [--out benchmarks/results/train_throughput.json]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from rich.console import Console  # noqa: E402
from threads import add_threads_option, apply_threads  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)
from transformers.utils import logging as hf_logging  # noqa: E402

from aclpipe import atomic  # noqa: E402
from aclpipe.config import DEFAULT_MODEL, Params, params_from_dict  # noqa: E402
from aclpipe.data.glue_sources import read_local  # noqa: E402
from aclpipe.data.prepared import load_split, subsample  # noqa: E402
from aclpipe.data.tasks import get_task  # noqa: E402
from aclpipe.modeling.backbone import load_tokenizer, resolve_model  # noqa: E402
from aclpipe.modeling.batching import collate  # noqa: E402
from aclpipe.stages.finetune import finetune  # noqa: E402
from aclpipe.stages.prepare import prepare  # noqa: E402
from aclpipe.training.batch_order import epoch_order  # noqa: E402
from aclpipe.training.progress import TrainProgress  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONTENDERS = (
    "ours",
    "ours-grouped",
    "ours-padded",
    "trainer-fixed",
    "trainer-dynamic",
    "trainer-grouped",
)
TARGETS = {  # (ours, Trainer): ours / Trainer samples/s, at least
    ("ours", "trainer-fixed"): 3.0,
    ("ours", "trainer-dynamic"): 1.5,  # the default: plain shuffle, padding-free
    ("ours-grouped", "trainer-dynamic"): 1.5,
    ("ours-grouped", "trainer-grouped"): 1.1,
    ("ours-padded", "trainer-dynamic"): 1.0,  # the same arithmetic: the loop's own overhead
}


@dataclass
class Run:
    """One timed training run of one contender."""

    contender: str
    samples: int  # trained examples inside the loop window
    steps: int
    loop_s: float  # loop window: first batch taken -> last optimiser step done
    call_s: float  # the whole call, from loading the weights
    loop_cpu_s: float  # CPU time of this process in the loop window (loop_cpu_s / loop_s:
    #                    the share of the cores it got, as a contention check)
    widths: list[int]  # padded width T of each batch [B, T], in order
    seed: int  # train.seed / TrainingArguments.seed of this run
    eval_s: float = 0.0  # ours: the dev evaluation after the epoch (inside call_s)
    dev_score: float | None = None  # ours: last exit's dev accuracy after the epoch
    reported_samples_per_s: float | None = None  # the Trainer's train_samples_per_second

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.loop_s

    @property
    def call_samples_per_s(self) -> float:
        """Whole call, less ours' dev evaluation (the Trainer runs none here)."""
        return self.samples / (self.call_s - self.eval_s)

    @property
    def mean_batch_tokens(self) -> float:
        return statistics.fmean(self.widths)

    @property
    def samples_per_cpu_s(self) -> float:
        """Samples per second of this process's CPU time: on one thread, what the loop costs
        whether or not the neighbours took the core away for a while."""
        return self.samples / self.loop_cpu_s

    @property
    def cpu_share(self) -> float:
        """Cores' worth of CPU time per second in the loop window (2.0: two cores, all ours)."""
        return self.loop_cpu_s / self.loop_s


class _Clock:
    """Timestamps and batch widths gathered during one run."""

    def __init__(self) -> None:
        self.start = self.end = self.cpu_start = self.cpu_end = self.evaluated = 0.0
        self.samples = self.steps = 0
        self.widths: list[int] = []

    def run(self, contender: str, call_s: float, seed: int) -> Run:
        return Run(
            contender,
            self.samples,
            self.steps,
            self.end - self.start,
            call_s,
            self.cpu_end - self.cpu_start,
            self.widths,
            seed,
            eval_s=self.evaluated - self.end if self.evaluated else 0.0,
        )

    def begin(self) -> None:
        self.start, self.cpu_start = time.perf_counter(), time.process_time()

    def tick(self) -> None:
        self.steps += 1
        self.end, self.cpu_end = time.perf_counter(), time.process_time()


class _TimedProgress(TrainProgress):
    """The loop's own progress display, recording its window into ``clock``: ``start`` is
    called as the loop starts taking batches, ``step`` after each optimiser step."""

    def __init__(self, clock: _Clock, console: Console, log_every: int) -> None:
        super().__init__(console, log_every)
        self.clock = clock

    def start(self, title: str, total_steps: int) -> None:
        self.clock.begin()
        super().start(title, total_steps)

    def step(self, log: dict, samples: int, seconds: float) -> None:
        super().step(log, samples, seconds)
        self.clock.samples += samples
        self.clock.tick()

    def epoch_done(self, stage: int, epoch: int, exits: list[int], scores: list[float]) -> None:
        self.clock.evaluated = time.perf_counter()  # the dev evaluation ran since the last step
        super().epoch_done(stage, epoch, exits, scores)


def _timed_collate(clock: _Clock):
    """The loop's ``collate``, recording each batch's padded width into ``clock``."""

    def timed_collate(rows: list[dict], pad_id: int, regression: bool) -> dict:
        batch = collate(rows, pad_id, regression)
        clock.widths.append(batch["input_ids"].shape[1])
        return batch

    return timed_collate


class _TimedCallback(TrainerCallback):
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def on_train_begin(self, args, state, control, **kwargs):
        self.clock.begin()

    def on_step_end(self, args, state, control, **kwargs):
        self.clock.tick()


def _counting(collator, clock: _Clock):
    def collate(features):
        batch = collator(features)
        clock.samples += batch["input_ids"].shape[0]
        clock.widths.append(batch["input_ids"].shape[1])
        return batch

    return collate


def benchmark_params(args: argparse.Namespace) -> Params:
    """aclpipe's defaults, with the benchmark's data and training settings (not params.yaml,
    so that a change of project defaults there does not move the benchmark)."""
    return params_from_dict(
        {
            "data": {
                "glue_dir": str(args.glue_dir),
                "max_length": args.max_length,
                "max_train_samples": args.samples,
                "max_eval_samples": args.eval_samples,
            },
            "model": {"name": DEFAULT_MODEL},
            "train": {
                "epochs": 1,
                "batch_size": args.batch_size,
                "device": "cpu",
                "seed": args.seed,
            },
        }
    )


def with_train(params: Params, **changes) -> Params:
    """``params`` with ``train`` fields changed (seed, group_by_length)."""
    return replace(params, train=replace(params.train, **changes))


def warmup_params(params: Params) -> Params:
    """The same settings on two batches: enough to take every code path once."""
    return params_from_dict(
        {
            "data": {
                **asdict(params.data),
                "max_train_samples": 2 * params.train.batch_size,
                "max_eval_samples": 32,
            },
            "model": {"name": params.model.name},
            "train": {"epochs": 1, "batch_size": params.train.batch_size, "device": "cpu"},
        }
    )


def run_ours(contender: str, params: Params, data_dir: Path, work: Path) -> Run:
    task, clock, out_dir = get_task("sst2"), _Clock(), work / "ours-model"
    quiet = Console(file=io.StringIO())  # the loop still logs every log_every steps, unseen
    started = time.perf_counter()
    result = finetune(
        task,
        "ce",
        params,
        data_dir,
        out_dir,
        console=quiet,
        progress=_TimedProgress(clock, quiet, params.train.log_every),
        collate=_timed_collate(clock),
    )
    call_s = time.perf_counter() - started
    shutil.rmtree(out_dir, ignore_errors=True)
    run = clock.run(contender, call_s, params.train.seed)
    run.dev_score = result["history"][-1]["dev_scores"][-1]
    return run


def our_order(n: int, seed: int) -> list[int]:
    """The order ``finetune`` takes ``n`` rows in, in stage 1's one epoch, with
    ``group_by_length: false`` (the loop's own ``epoch_order``, a plain seeded shuffle, which
    depends on neither the lengths nor the batch size)."""
    return epoch_order([0] * n, 1, seed, 0, 0, grouped=False)


def trainer_rows(params: Params, padded: bool) -> list[dict]:
    """The same SST-2 subset as ``prepare`` writes, tokenized the run_glue way, in the order
    our loop takes it."""
    task = get_task("sst2")
    examples = subsample(
        read_local(task, Path(params.data.glue_dir), "train"),
        params.data.max_train_samples,
        params.data.seed,
    )
    tokenizer = load_tokenizer(params.model.name)
    encoded = tokenizer(
        [e.text_a for e in examples],
        truncation=True,
        max_length=params.data.max_length,
        padding="max_length" if padded else False,
    )
    rows = [
        {**{k: encoded[k][i] for k in encoded}, "labels": e.label} for i, e in enumerate(examples)
    ]
    return [rows[i] for i in our_order(len(rows), params.train.seed)]


def run_trainer(
    contender: str, params: Params, rows: list[dict], collator, work: Path, grouped: bool = False
) -> Run:
    clock, t = _Clock(), params.train
    started = time.perf_counter()
    model = AutoModelForSequenceClassification.from_pretrained(
        resolve_model(params.model.name), num_labels=get_task("sst2").num_labels
    )
    args = TrainingArguments(
        output_dir=str(work / "trainer"),
        per_device_train_batch_size=t.batch_size,
        num_train_epochs=t.epochs,
        learning_rate=t.lr,
        weight_decay=t.weight_decay,
        warmup_steps=t.warmup_ratio,  # a float < 1 is a share of the steps in transformers 5
        lr_scheduler_type="linear",
        max_grad_norm=t.max_grad_norm,
        seed=t.seed,
        use_cpu=True,
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        # sequential: rows come in our loop's shuffled order; or the Trainer's own grouping
        train_sampling_strategy="group_by_length" if grouped else "sequential",
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=rows,
        data_collator=_counting(collator, clock),
        callbacks=[_TimedCallback(clock)],
    )
    trainer.remove_callback(PrinterCallback)  # no metrics dict printed at the end
    output = trainer.train()
    call_s = time.perf_counter() - started
    run = clock.run(contender, call_s, t.seed)
    run.reported_samples_per_s = output.metrics["train_samples_per_second"]
    return run


def summarise(rounds: list[dict[str, Run]], contenders: tuple[str, ...], dev_examples: int) -> dict:
    def median(contender: str, attr: str) -> float:
        return statistics.median(getattr(r[contender], attr) for r in rounds)

    figures = {
        c: {
            "samples_per_s": median(c, "samples_per_s"),
            "call_samples_per_s": median(c, "call_samples_per_s"),
            "samples_per_cpu_s": median(c, "samples_per_cpu_s"),
            "cpu_share": median(c, "cpu_share"),
            "mean_batch_tokens": median(c, "mean_batch_tokens"),
        }
        for c in contenders
    }
    ratios = {}
    for (ours, other), target in TARGETS.items():
        if ours not in contenders or other not in contenders:
            continue
        per_round = [r[ours].samples_per_s / r[other].samples_per_s for r in rounds]
        per_round_tokens = [
            r[ours].samples_per_s
            * r[ours].mean_batch_tokens
            / (r[other].samples_per_s * r[other].mean_batch_tokens)
            for r in rounds
        ]
        per_round_cpu = [r[ours].samples_per_cpu_s / r[other].samples_per_cpu_s for r in rounds]
        per_round_call = [r[ours].call_samples_per_s / r[other].call_samples_per_s for r in rounds]
        ratio = statistics.median(per_round)
        ratios[f"{ours}/{other}"] = {
            "ratio": ratio,
            "target": target,
            "met": ratio >= target,
            "per_round": per_round,
            "padded_tokens_ratio": statistics.median(per_round_tokens),
            "whole_call_ratio": statistics.median(per_round_call),
            "cpu_time_ratio": statistics.median(per_round_cpu),
        }
    same = None
    plain = [c for c in ("ours", "ours-padded") if c in contenders]
    if plain and "trainer-dynamic" in contenders:
        same = all(r[plain[0]].widths == r["trainer-dynamic"].widths for r in rounds)
    return {
        "figures": figures,
        "ratios": ratios,
        "dev_scores": dev_scores(rounds, contenders, dev_examples),
        "same_batches": same,
    }


def dev_scores(rounds: list[dict[str, Run]], contenders: tuple[str, ...], examples: int) -> dict:
    """Ours' dev accuracy per seed, plain and grouped; the difference beside the noise: the
    spread over seeds and the binomial standard error of one accuracy on the dev examples."""
    ours = [c for c in ("ours", "ours-grouped", "ours-padded") if c in contenders]
    scores = {c: [r[c].dev_score for r in rounds] for c in ours}
    record: dict = {
        "seeds": [r[ours[0]].seed for r in rounds] if ours else [],
        "per_seed": scores,
        "mean": {c: statistics.fmean(s) for c, s in scores.items()},
    }
    for c, s in scores.items():
        p = statistics.fmean(s)
        record.setdefault("binomial_se", {})[c] = math.sqrt(p * (1 - p) / examples)
        if len(s) > 1:
            record.setdefault("stdev_over_seeds", {})[c] = statistics.stdev(s)
    if "ours" in scores and "ours-grouped" in scores:
        record["mean_difference_grouped_minus_plain"] = statistics.fmean(
            g - p for g, p in zip(scores["ours-grouped"], scores["ours"])
        )
    if "ours" in scores and "ours-padded" in scores:
        record["mean_difference_padding_free_minus_padded"] = statistics.fmean(
            f - p for f, p in zip(scores["ours"], scores["ours-padded"])
        )
    return record


def print_table(summary: dict, args: argparse.Namespace) -> None:
    print(
        f"\nSST-2 train, {args.samples} examples, batch {args.batch_size}, 1 epoch, MiniLM-L6, "
        f"CPU, {torch.get_num_threads()} thread(s); medians of {args.repeats} rounds "
        f"(seeds {args.seed}..{args.seed + args.repeats - 1})"
    )
    header = ("contender", "samples/s", "per CPU-s", "whole call", "batch T", "cores")
    print(f"{header[0]:<17}" + "".join(f"{h:>11}" for h in header[1:]))
    for name, f in summary["figures"].items():
        columns = ("samples_per_s", "samples_per_cpu_s", "call_samples_per_s")
        print(
            f"{name:<17}"
            + "".join(f"{f[c]:>11.1f}" for c in columns)
            + f"{f['mean_batch_tokens']:>11.1f}{f['cpu_share']:>11.2f}"
        )
    for name, r in summary["ratios"].items():
        verdict = "met" if r["met"] else "NOT met"
        rounds = ", ".join(f"{x:.2f}" for x in r["per_round"])
        print(
            f"{name:<30} {r['ratio']:.2f}x  target >= {r['target']:.1f}x: {verdict}  "
            f"(rounds {rounds}; per CPU-s {r['cpu_time_ratio']:.2f}x; "
            f"whole call {r['whole_call_ratio']:.2f}x; padded tokens/s "
            f"{r['padded_tokens_ratio']:.2f}x)"
        )
    dev = summary["dev_scores"]
    for name, scores in dev["per_seed"].items():
        shown = ", ".join(f"{100 * s:.1f}" for s in scores)
        print(
            f"dev accuracy {name:<13} {shown}  (mean {100 * dev['mean'][name]:.2f}; "
            f"binomial s.e. {100 * dev['binomial_se'][name]:.2f})"
        )
    if "mean_difference_grouped_minus_plain" in dev:
        print(f"grouped - plain: {100 * dev['mean_difference_grouped_minus_plain']:+.2f} points")
    if "mean_difference_padding_free_minus_padded" in dev:
        gap = dev["mean_difference_padding_free_minus_padded"]
        print(f"padding-free - padded (plain shuffle): {100 * gap:+.2f} points")
    if summary["same_batches"] is not None:
        print(
            "ours and trainer-dynamic trained on the same batches: "
            + ("yes" if summary["same_batches"] else "NO (compare padded tokens/s)")
        )


def round_runs(params: Params, data_dir: Path, tokenizer, work: Path, seed: int) -> dict:
    """Each contender's run at ``seed``, uncalled, in round-robin order."""
    params = with_train(params, seed=seed)
    fixed, dynamic = trainer_rows(params, padded=True), trainer_rows(params, padded=False)
    ours_ids = [r["input_ids"] for r in load_split(data_dir, "train")]
    ours_ids = [ours_ids[i] for i in our_order(len(ours_ids), seed)]
    if ours_ids != [r["input_ids"] for r in dynamic]:
        raise SystemExit("ours and the Trainer were given different token ids")
    padding = DataCollatorWithPadding(tokenizer)
    return {
        "ours": lambda: run_ours(
            "ours", with_train(params, group_by_length=False, padding_free=True), data_dir, work
        ),
        "ours-grouped": lambda: run_ours(
            "ours-grouped",
            with_train(params, group_by_length=True, padding_free=True),
            data_dir,
            work,
        ),
        "ours-padded": lambda: run_ours(
            "ours-padded",
            with_train(params, group_by_length=False, padding_free=False),
            data_dir,
            work,
        ),
        "trainer-fixed": lambda: run_trainer(
            "trainer-fixed", params, fixed, default_data_collator, work
        ),
        "trainer-dynamic": lambda: run_trainer("trainer-dynamic", params, dynamic, padding, work),
        "trainer-grouped": lambda: run_trainer(
            "trainer-grouped", params, dynamic, padding, work, grouped=True
        ),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--samples", type=int, default=320, help="SST-2 train examples (320: 10 batches of 32)"
    )
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after a warm-up")
    parser.add_argument("--seed", type=int, default=42, help="round r trains at seed + r - 1")
    parser.add_argument("--max-length", type=int, default=128, help="truncation / fixed padding")
    add_threads_option(parser)  # for all of them
    parser.add_argument(
        "--eval-samples",
        type=int,
        default=872,
        help="dev examples ours is scored on after the epoch, outside the window (872: all)",
    )
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated subset of {', '.join(CONTENDERS)}",
    )
    parser.add_argument("--glue-dir", type=Path, default=REPO.parent / "shared" / "glue")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "train_throughput.json"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    args.contenders = tuple(c.strip() for c in args.contenders.split(",") if c.strip())
    unknown = [c for c in args.contenders if c not in CONTENDERS]
    if unknown or not args.contenders:
        parser.error(f"--contenders {unknown or 'empty'}: use names from {', '.join(CONTENDERS)}")
    args.contenders = tuple(c for c in CONTENDERS if c in args.contenders)  # round-robin order
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    apply_threads(args.threads)
    params = benchmark_params(args)
    warm = warmup_params(params)
    work = Path(tempfile.mkdtemp(prefix="aclpipe-bench-"))
    try:
        tokenizer = load_tokenizer(params.model.name)
        data, meta = {}, {}
        for label, p in (("warm-up", warm), ("timed", params)):
            data[label] = work / f"sst2-{label}"
            meta = prepare(
                get_task("sst2"), p.data, p.model.name, data[label], Path(p.data.glue_dir)
            )
        dev_examples = meta["splits"][get_task("sst2").dev_splits[0][0]]["examples"]
        rounds: list[dict[str, Run]] = []
        for index in range(args.repeats + 1):  # round 0 is the warm-up
            label = "warm-up" if index == 0 else "timed"
            p = warm if index == 0 else params
            seed = args.seed + max(index - 1, 0)
            runs = round_runs(p, data[label], tokenizer, work, seed)
            this_round = {name: runs[name]() for name in args.contenders}
            label = "warm-up" if index == 0 else f"round {index}/{args.repeats} (seed {seed})"
            print(
                label
                + ": "
                + "  ".join(f"{n} {r.samples_per_s:.1f}/s" for n, r in this_round.items()),
                flush=True,
            )
            if index:
                rounds.append(this_round)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarise(rounds, args.contenders, dev_examples)
    print_table(summary, args)
    command = "python benchmarks/train_throughput.py " + " ".join(argv or sys.argv[1:])
    record = {
        "benchmark": "train_throughput",
        "command": command.strip(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "setup": {
            "task": "sst2",
            "method": "ce",
            "model": DEFAULT_MODEL,
            "samples": args.samples,
            "batch_size": args.batch_size,
            "max_length": args.max_length,
            "repeats": args.repeats,
            "seeds": [args.seed + i for i in range(args.repeats)],
            "eval_samples": dev_examples,
            "contenders": list(args.contenders),
            "mean_tokens": meta["splits"]["train"]["mean_tokens"],
            "window": "first batch taken -> last optimiser step done",
        },
        "environment": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "trainer_optim": TrainingArguments(output_dir="unused").optim.value,
        },
        **summary,
        "runs": [
            {
                c: {
                    **asdict(r[c]),
                    "samples_per_s": r[c].samples_per_s,
                    "mean_batch_tokens": r[c].mean_batch_tokens,
                    "cpu_share": r[c].cpu_share,
                    "samples_per_cpu_s": r[c].samples_per_cpu_s,
                }
                for c in args.contenders
            }
            for r in rounds
        ],
    }
    atomic.write_text(args.out, json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    missed = [name for name, r in summary["ratios"].items() if not r["met"]]
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
