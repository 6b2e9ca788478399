"""What a user of `aclpipe predict` gets: early exit on ONNX Runtime against the full model.

Four contenders, side by side in one run, through the whole predict path
(``aclpipe.early_exit.predict.Predictor.records``: tokenize, sort by length, pad, run the
engine, build the output records in input order), on the SST-2 dev sentences:

- ``full-torch``: the full model in PyTorch eager (``--engine torch --policy none``);
- ``full-onnx``: the full model on ONNX Runtime (``--engine onnx --policy none``);
- ``ee-torch``: the PyTorch early-exit runtime at the export's default setting (the 1-point
  budget's pick of the trade-off sweep, ``export.json: default_setting``);
- ``ee-onnx``: the ONNX Runtime early-exit runtime at the same setting;
- with an export made with ``--int8``, also ``full-onnx-int8`` and ``ee-onnx-int8``: the
  int8 segments (``predict --precision int8``), full model and early exit at that setting.
  They are another, approximate model: each contender's SST-2 dev accuracy is reported beside
  its speed, and the targets are checked for the float32 engine and, apart, for int8.

Each contender is loaded once (its start-up, imports aside, is timed and reported apart) and
warmed up on 32 sentences; then ``--repeats`` rounds run the four round-robin, at batch 1 and
at batch 32. Within a round the sentences are cut into ``--blocks`` slices and the four take
turns slice by slice (each round's first contender rotates), so a slow moment of the shared
machine, which lasts seconds, falls on all four alike (run whole, one after the other, the
same contender's rounds differed by 50% on 2026-12-02). A figure is the median over
rounds of sentences/s of the whole path; a ratio is the median over rounds of that round's
ratio. Both engines run on ``--threads`` intra-op threads (one by default: on a shared
2-core machine a second thread waits on its busy sibling at every op, see threads.py).

Targets: the engine, ``ee-onnx`` >= 2x ``ee-torch`` at batch 1 and >= 1.5x at
batch 32, and ``ee-onnx`` >= 0.9 of its layer speed-up over ``full-onnx``; the product,
``ee-onnx`` >= 4x ``full-torch`` at batch 1 and >= 3x at batch 32.

Usage (from the repository root, after `dvc repro`)::

    python benchmarks/predict_throughput.py [--export models/sst2/acl-cl/export]
        [--glue-dir ../shared/glue] [--examples 872] [--repeats 5] [--blocks 8] [--threads 1]
        [--out benchmarks/results/predict_throughput.json]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from threads import add_threads_option, apply_threads, machine, recorded_path  # noqa: E402

from aclpipe.early_exit.predict import Predictor  # noqa: E402

CONTENDERS = ("full-torch", "full-onnx", "ee-torch", "ee-onnx")
INT8 = ("full-onnx-int8", "ee-onnx-int8")  # when the export has int8 segments
TARGETS = {  # (numerator, denominator, batch size): at least
    ("ee-onnx", "ee-torch", 1): 2.0,
    ("ee-onnx", "ee-torch", 32): 1.5,
    ("ee-onnx", "full-torch", 1): 4.0,
    ("ee-onnx", "full-torch", 32): 3.0,
}


def sst2_dev(glue_dir: Path, limit: int) -> tuple[list[str], list[int]]:
    with open(glue_dir / "SST-2" / "dev.tsv", encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [row[0] for row in rows[1:]][:limit], [int(row[1]) for row in rows[1:]][:limit]


def load(export: Path, name: str, setting: dict, batch: int, threads: int) -> Predictor:
    engine = name.split("-")[1]
    precision = "int8" if name.endswith("-int8") else "fp32"
    if name.startswith("full"):
        return Predictor(export, "none", None, engine, batch, threads=threads,
                         precision=precision)  # fmt: skip
    return Predictor(export, setting["policy"], setting["threshold"], engine, batch,
                     threads=threads, precision=precision)  # fmt: skip


def run_once(predictor: Predictor, lines: list[str]) -> tuple[float, list[dict]]:
    started = time.perf_counter()
    out = list(predictor.records(lines))
    return time.perf_counter() - started, out


def measure(args, lines: list[str], labels: list[int], setting: dict, batch: int,
            contenders: tuple[str, ...]) -> dict:  # fmt: skip
    predictors, startup = {}, {}
    for name in contenders:
        started = time.perf_counter()
        predictors[name] = load(args.export, name, setting, batch, args.threads)
        startup[name] = time.perf_counter() - started
        run_once(predictors[name], lines[:32])  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    outputs: dict[str, list[dict]] = {}
    size = -(-len(lines) // max(1, args.blocks))
    blocks = [lines[i : i + size] for i in range(0, len(lines), size)]
    for round_ in range(args.repeats):
        first = round_ % len(contenders)
        order = contenders[first:] + contenders[:first]  # who goes first rotates
        took = dict.fromkeys(contenders, 0.0)
        outputs = {name: [] for name in contenders}
        for block in blocks:  # they take turns block by block: a slow moment hits all
            for name in order:
                block_seconds, out = run_once(predictors[name], block)
                took[name] += block_seconds
                outputs[name] += out
        for name in contenders:
            seconds[name].append(took[name])
    rates = {n: len(lines) / statistics.median(s) for n, s in seconds.items()}

    def ratio(a: str, b: str) -> float:  # median over rounds of the round's ratio
        return statistics.median(sb / sa for sa, sb in zip(seconds[a], seconds[b]))

    mean_layer = statistics.fmean(r["exit_layer"] for r in outputs["ee-onnx"])
    num_layers = max(r["exit_layer"] for r in outputs["full-onnx"])
    layer_speedup = num_layers / mean_layer
    same_exit = sum(
        a["exit_layer"] == b["exit_layer"] for a, b in zip(outputs["ee-onnx"], outputs["ee-torch"])
    )
    same_label = sum(
        a["label"] == b["label"] for a, b in zip(outputs["ee-onnx"], outputs["ee-torch"])
    )
    pairs = [("ee-onnx", "ee-torch"), ("ee-onnx", "full-torch"), ("ee-onnx", "full-onnx"),
             ("ee-torch", "full-torch"), ("full-onnx", "full-torch")]  # fmt: skip
    if "ee-onnx-int8" in contenders:
        pairs += [("ee-onnx-int8", "ee-torch"), ("ee-onnx-int8", "full-torch"),
                  ("ee-onnx-int8", "full-onnx-int8"), ("ee-onnx-int8", "ee-onnx"),
                  ("full-onnx-int8", "full-onnx")]  # fmt: skip
    result = {
        "batch_size": batch,
        "sentences_per_second": {n: round(r, 1) for n, r in rates.items()},
        "dev_accuracy": {
            n: round(statistics.fmean(r["label"] == y for r, y in zip(out, labels)), 4)
            for n, out in outputs.items()
        },
        "mean_exit_layer_per_contender": {
            n: round(statistics.fmean(r["exit_layer"] for r in out), 3) for n, out in outputs.items()
        },
        "startup_seconds": {n: round(s, 3) for n, s in startup.items()},
        "ratios": {f"{a}/{b}": round(ratio(a, b), 3) for a, b in pairs},
        "mean_exit_layer": round(mean_layer, 3),
        "layer_speedup": round(layer_speedup, 3),
        "ee-onnx_share_of_layer_speedup": round(ratio("ee-onnx", "full-onnx") / layer_speedup, 3),
        "ee-onnx_vs_ee-torch_same_exit": same_exit / len(lines),
        "ee-onnx_vs_ee-torch_same_label": same_label / len(lines),
        "seconds": {n: [round(x, 4) for x in s] for n, s in seconds.items()},
    }
    if "ee-onnx-int8" in contenders:
        int8_layer = statistics.fmean(r["exit_layer"] for r in outputs["ee-onnx-int8"])
        result["ee-onnx-int8_share_of_layer_speedup"] = round(
            ratio("ee-onnx-int8", "full-onnx-int8") / (num_layers / int8_layer), 3
        )
        for other in ("ee-onnx", "ee-torch"):
            for key in ("label", "exit_layer"):
                result[f"ee-onnx-int8_vs_{other}_same_{key}"] = sum(
                    a[key] == b[key] for a, b in zip(outputs["ee-onnx-int8"], outputs[other])
                ) / len(lines)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, default=Path("models/sst2/acl-cl/export"))
    parser.add_argument("--glue-dir", type=Path, default=Path("../shared/glue"))
    parser.add_argument("--examples", type=int, default=872, help="SST-2 dev sentences")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per batch size")
    parser.add_argument(
        "--blocks",
        type=int,
        default=8,
        help="slices of the sentences the contenders take turns on within a round",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/predict_throughput.json")
    )
    add_threads_option(parser)
    args = parser.parse_args()
    args.threads = apply_threads(args.threads)
    record = json.loads((args.export / "export.json").read_text(encoding="utf-8"))
    setting = record.get("default_setting")
    if not setting or setting["policy"] == "none":
        sys.exit(f"{args.export} has no early-exit default setting: run `dvc repro` first")
    lines, labels = sst2_dev(args.glue_dir, args.examples)
    if len(lines) < 200:
        print(f"warning: {len(lines)} sentences are too few for a stable figure", file=sys.stderr)
    contenders = CONTENDERS + (INT8 if record.get("int8") else ())
    results = [measure(args, lines, labels, setting, batch, contenders) for batch in (1, 32)]
    import onnxruntime
    import torch
    import transformers

    checks = []
    for suffix in ("", "-int8") if "ee-onnx-int8" in contenders else ("",):
        for (a, b, batch), target in TARGETS.items():
            ratio = f"{a}{suffix}/{b}"
            got = next(r for r in results if r["batch_size"] == batch)["ratios"][ratio]
            checks.append({"ratio": ratio, "batch_size": batch, "value": got, "target": target,
                           "met": got >= target})  # fmt: skip
        for r in results:
            share = r[f"ee-onnx{suffix}_share_of_layer_speedup"]
            checks.append({"ratio": f"ee-onnx{suffix}/full-onnx{suffix} over layer speed-up",
                           "batch_size": r["batch_size"], "value": share, "target": 0.9,
                           "met": share >= 0.9})  # fmt: skip
    report = {
        "benchmark": "predict_throughput",
        "command": "python " + " ".join(sys.argv),
        "date": datetime.date.today().isoformat(),
        "setup": {
            "export": recorded_path(args.export),  # no machine path in results
            "sentences": len(lines),
            "repeats": args.repeats,
            "blocks": args.blocks,
            "setting": setting,
            "threads": args.threads,
        },  # fmt: skip
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__,
            "transformers": transformers.__version__,
            **machine(),
        },  # fmt: skip
        "results": results,
        "targets": checks,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"setting {setting['policy']}@{setting['threshold']:g}, {len(lines)} SST-2 dev sentences, "
          f"{args.threads} thread(s), median of {args.repeats} rounds")  # fmt: skip
    for r in results:
        rates = "  ".join(f"{n} {v:.1f}/s" for n, v in r["sentences_per_second"].items())
        print(f"batch {r['batch_size']:>2}: {rates}")
        print(f"          dev accuracy {r['dev_accuracy']}")
        print(f"          ratios {r['ratios']}; mean exit layer {r['mean_exit_layer']}, layer "
              f"speed-up {r['layer_speedup']}x, ee-onnx share of it {r['ee-onnx_share_of_layer_speedup']}")  # fmt: skip
    for c in checks:
        print(f"target {c['ratio']} at batch {c['batch_size']}: {c['value']:.2f} vs {c['target']}"
              f" -> {'met' if c['met'] else 'NOT met'}")  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
