"""Early exit: measured speed-up over layer speed-up, and ONNX Runtime against PyTorch per exit.

A trained multi-exit model (``aclpipe finetune``) on its task's dev split (``aclpipe prepare``).

1. Early exit. For each policy (entropy, confidence, patience) three thresholds, picked from
   the model's own dev logits so that the layer speed-up spans light to heavy exiting
   (about 1.3x to 4x). Per setting and batch size (1 and 32):

   - layer speed-up = ``L * N / sum(exit layers)``, the policy applied to the all-exit logits
     of the timed examples (``L`` = the deepest exit, the layers ``full_forward`` runs);
   - measured speed-up = ``full_forward`` time / ``EarlyExitRuntime`` time on the same batches;
   - their ratio, against the targets (issue: early-exit speed): at least 0.9 at batch 1 and
     at least 0.8 at batch 32 (per-sample exit with a shrinking batch).

   Calls are interleaved batch by batch (full model and every setting on batch j, in an order
   that rotates, then batch j+1), so machine noise falls on all of them alike; one untimed
   pass warms up, and each figure is the median over the repeats of the pass total.

2. ONNX. Per exit k, batch 1: onnxruntime (CPU provider, default threads) running
   ``exit_<k>.onnx`` against PyTorch running the same exit's ``ExitGraph`` (eval, inference
   mode), interleaved per example; per example the median of the repeats, then the median over
   the examples. The graphs come from ``--onnx-dir`` (default ``<model>/export``, written by
   ``aclpipe export``); failing that they are exported into a temporary folder.

Absolute times drift on a shared machine; the ratios, measured side by side, are the figures.

    python benchmarks/early_exit_speed.py --model models/sst2/acl-cl --data data/sst2
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from aclpipe.data import collate, load_meta, load_split  # noqa: E402
from aclpipe.model import MultiExitModel, load_multi_exit  # noqa: E402
from aclpipe.policies import exit_indices  # noqa: E402
from aclpipe.runtime import EarlyExitRuntime, full_forward  # noqa: E402
from aclpipe.scoring import all_exit_logits  # noqa: E402
from aclpipe.tasks import get_task  # noqa: E402

POLICIES = ("entropy", "confidence", "patience")
TARGET_SPEEDUPS = (1.5, 2.2, 3.2)  # light, medium, heavy exiting (layer speed-up)
SPEEDUP_RANGE = (1.3, 4.0)
TARGET_RATIO = {1: 0.9, 32: 0.8}  # measured / layer speed-up (issue: early-exit speed)


# --- thresholds ------------------------------------------------------------------------------


def layer_speedup(logits: np.ndarray, exits: list[int], policy: str, threshold: float) -> float:
    """``L * N / sum(exit layers)`` for all-exit logits ``[E, N, C]``; L = the deepest exit."""
    layers = np.asarray(exits)[exit_indices(policy, threshold, logits)]  # [N]
    return exits[-1] * len(layers) / float(layers.sum())


def nearest_threshold(logits, exits, policy: str, target: float, lo: float, hi: float) -> float:
    """The threshold in ``[lo, hi]`` whose layer speed-up is nearest ``target``, by bisection:
    the speed-up rises with the entropy bound S and falls with the confidence bound delta."""
    rising = policy == "entropy"
    for _ in range(16):
        mid = (lo + hi) / 2
        if (layer_speedup(logits, exits, policy, mid) < target) == rising:
            lo = mid
        else:
            hi = mid
    ends = (round(lo, 4), round(hi, 4))
    return min(ends, key=lambda t: abs(math.log(layer_speedup(logits, exits, policy, t) / target)))


def pick_thresholds(logits: np.ndarray, exits: list[int], policy: str, num_labels: int) -> list:
    """Up to three thresholds whose layer speed-up (on ``logits``) is near TARGET_SPEEDUPS,
    kept inside SPEEDUP_RANGE where the model allows it; lightest exiting first."""
    if policy == "patience":  # t = 1 .. E-1; at most E/(t+1)x with an exit at every layer
        grid = [float(t) for t in range(1, len(exits))]
        picks = [
            min(grid, key=lambda t: abs(math.log(layer_speedup(logits, exits, policy, t) / g)))
            for g in TARGET_SPEEDUPS
        ]
    else:
        lo, hi = (0.0, math.log(max(num_labels, 2))) if policy == "entropy" else (0.5, 1.0)
        picks = [nearest_threshold(logits, exits, policy, g, lo, hi) for g in TARGET_SPEEDUPS]
    speedups = {t: layer_speedup(logits, exits, policy, t) for t in picks}
    inside = [t for t in speedups if SPEEDUP_RANGE[0] <= speedups[t] <= SPEEDUP_RANGE[1]]
    return sorted(inside or speedups, key=speedups.get)


# --- timing ----------------------------------------------------------------------------------


def make_batches(rows: list[dict], size: int, pad_id: int) -> list[dict]:
    """Right-padded batches in dev order (no length sorting: what a server would see)."""
    out = []
    for start in range(0, len(rows), size):
        batch = collate(rows[start : start + size], pad_id, regression=False)
        batch.pop("labels")
        out.append(batch)
    return out


def time_interleaved(calls: dict[str, Callable], batches: list[dict], repeats: int) -> dict:
    """Seconds per full pass over ``batches`` for each call: a list of ``repeats`` totals.

    Batch by batch, every call runs once, in an order rotated per batch and repeat.
    """
    names = list(calls)
    for batch in batches:  # warm-up
        for name in names:
            calls[name](**batch)
    totals: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            spent = dict.fromkeys(names, 0.0)
            for j, batch in enumerate(batches):
                shift = (j + r) % len(names)
                for name in names[shift:] + names[:shift]:
                    started = time.perf_counter()
                    calls[name](**batch)
                    spent[name] += time.perf_counter() - started
            for name in names:
                totals[name].append(spent[name])
    finally:
        gc.enable()
    return totals


def runtime_agreement(runtime: EarlyExitRuntime, batches: list[dict], offline: np.ndarray):
    """Share of samples whose runtime exit equals the offline policy's, and the runtime's own
    layer speed-up (its exits can differ where a logit sits on the threshold)."""
    with torch.inference_mode():
        got = torch.cat([runtime(**b).exit_index for b in batches]).numpy()  # [N]
    layers = np.asarray(runtime.model.spec.exits)[got]
    own = runtime.model.spec.exits[-1] * len(layers) / float(layers.sum())
    return float((got == offline).mean()), own


def early_exit_section(
    model: MultiExitModel,
    rows_by_size: dict[int, list[dict]],
    logits_by_size: dict[int, np.ndarray],
    settings: list[tuple[str, float]],
    pad_id: int,
    repeats: int,
) -> list[dict]:
    exits = model.spec.exits
    results = []
    for size, rows in rows_by_size.items():
        batches = make_batches(rows, size, pad_id)
        runtimes = {f"{p} {t:g}": EarlyExitRuntime(model, p, t) for p, t in settings}
        calls: dict[str, Callable] = {"full": lambda **b: full_forward(model, **b), **runtimes}
        with torch.inference_mode():
            totals = time_interleaved(calls, batches, repeats)
        full = statistics.median(totals["full"])
        for (policy, threshold), (name, runtime) in zip(settings, runtimes.items()):
            offline = exit_indices(policy, threshold, logits_by_size[size])
            layer = layer_speedup(logits_by_size[size], exits, policy, threshold)
            agree, own = runtime_agreement(runtime, batches, offline)
            measured = full / statistics.median(totals[name])
            paired = [f / s for f, s in zip(totals["full"], totals[name])]
            results.append(
                {
                    "batch_size": size,
                    "examples": len(rows),
                    "policy": policy,
                    "threshold": threshold,
                    "layer_speedup": round(layer, 3),
                    "measured_speedup": round(measured, 3),
                    "ratio": round(measured / layer, 3),
                    "target": TARGET_RATIO.get(size),
                    "meets_target": measured / layer >= TARGET_RATIO.get(size, 0.0),
                    "paired_ratio_range": [
                        round(min(paired) / layer, 3),
                        round(max(paired) / layer, 3),
                    ],
                    "runtime_agrees_with_offline": round(agree, 4),
                    "runtime_layer_speedup": round(own, 3),
                    "seconds_full": round(full, 4),
                    "seconds_early_exit": round(statistics.median(totals[name]), 4),
                }
            )
    return results


# --- ONNX ------------------------------------------------------------------------------------


def onnx_paths(args, model: MultiExitModel, rows: list[dict], pad_id: int, tmp: Path):
    """``{layer: exit_<layer>.onnx}`` and a note on where they came from."""
    folder = args.onnx_dir or args.model / "export"
    found = {k: folder / f"exit_{k}.onnx" for k in model.spec.exits}
    if all(p.exists() for p in found.values()):
        return found, f"graphs from {folder}"
    from aclpipe.export import ExitGraph, export_exit, parity_batches

    names = input_names(model, rows)
    example = parity_batches(rows, pad_id, names)[0]  # several rows: no axis fixed to 1
    started = time.perf_counter()
    paths = {}
    for index, layer in enumerate(model.spec.exits):
        graph = ExitGraph(model, index, "token_type_ids" in names).eval()
        paths[layer] = tmp / f"exit_{layer}.onnx"
        export_exit(graph, example, paths[layer], None, layer, model.encoder.config.model_type)
        print(f"  exported exit {layer} ({time.perf_counter() - started:.0f}s)", flush=True)
    return paths, f"no graphs in {folder}: exported into a temporary folder (dynamo=True)"


def input_names(model: MultiExitModel, rows: list[dict]) -> list[str]:
    accepted = inspect.signature(model.encoder.embeddings.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in rows[0] and "token_type_ids" in accepted:
        names.append("token_type_ids")
    return names


def _timed(fn: Callable, *args, **kwargs):
    started = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - started, out


def onnx_section(model, paths: dict[int, Path], rows: list[dict], pad_id: int, repeats: int):
    """Per exit: median over ``rows`` (batch 1) of onnxruntime's and PyTorch's latency."""
    import onnxruntime as ort

    from aclpipe.export import ExitGraph

    sessions = {
        k: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        for k, p in paths.items()
    }
    names = [i.name for i in sessions[model.spec.exits[0]].get_inputs()]
    graphs = {
        k: ExitGraph(model, i, "token_type_ids" in names).eval()
        for i, k in enumerate(model.spec.exits)
    }
    examples = []
    for row in rows:
        batch = collate([row], pad_id, regression=False)
        if "token_type_ids" not in batch:
            batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
        examples.append({n: batch[n] for n in names})  # [1, T] int64 each
    feeds = [{n: t.numpy() for n, t in tensors.items()} for tensors in examples]
    per_example = {k: ([], []) for k in paths}  # exit -> (onnxruntime s, torch s), per example
    gaps = dict.fromkeys(paths, 0.0)
    with torch.inference_mode():
        for k in paths:  # warm-up
            for _ in range(3):
                sessions[k].run(None, feeds[0]), graphs[k](**examples[0])
        for j, (tensors, feed) in enumerate(zip(examples, feeds)):
            for k in paths:
                ort_s, torch_s = [], []
                for r in range(repeats):
                    if (j + r) % 2 == 0:  # alternate who goes first
                        spent, (ort_out,) = _timed(sessions[k].run, None, feed)
                        ort_s.append(spent)
                        spent, torch_out = _timed(graphs[k], **tensors)
                        torch_s.append(spent)
                    else:
                        spent, torch_out = _timed(graphs[k], **tensors)
                        torch_s.append(spent)
                        spent, (ort_out,) = _timed(sessions[k].run, None, feed)
                        ort_s.append(spent)
                gaps[k] = max(gaps[k], float(np.abs(ort_out - torch_out.numpy()).max()))
                per_example[k][0].append(statistics.median(ort_s))
                per_example[k][1].append(statistics.median(torch_s))
    results = []
    for k, (ort_s, torch_s) in per_example.items():
        ort_ms, torch_ms = 1000 * statistics.median(ort_s), 1000 * statistics.median(torch_s)
        results.append(
            {
                "exit": k,
                "onnxruntime_ms": round(ort_ms, 3),
                "torch_ms": round(torch_ms, 3),
                "onnxruntime_over_torch": round(ort_ms / torch_ms, 3),
                "max_abs_diff": gaps[k],
            }
        )
    return results


# --- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/sst2/acl-cl"))
    parser.add_argument("--data", type=Path, default=Path("data/sst2"))
    parser.add_argument("--examples", type=int, default=200, help="dev examples at batch 1")
    parser.add_argument("--examples-batched", type=int, default=872, help="at batch 32")
    parser.add_argument("--onnx-examples", type=int, default=100, help="dev examples, ONNX part")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--onnx-dir", type=Path, default=None, help="default <model>/export")
    parser.add_argument("--skip-onnx", action="store_true")
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/early_exit_speed.json")
    )
    args = parser.parse_args()
    started = time.perf_counter()

    task = get_task(load_meta(args.data)["task"])
    model = load_multi_exit(args.model).eval()
    rows = load_split(args.data, task.dev_splits[0][0])
    pad_id = model.encoder.config.pad_token_id or 0
    exits = model.spec.exits
    dev_logits = all_exit_logits(model, rows, 64, pad_id, regression=False)  # [E, N, C]
    settings = [
        (p, t) for p in POLICIES for t in pick_thresholds(dev_logits, exits, p, task.num_labels)
    ]
    rows_by_size = {1: rows[: args.examples], 32: rows[: args.examples_batched]}
    logits_by_size = {s: dev_logits[:, : len(r)] for s, r in rows_by_size.items()}
    print(
        f"{task.name} dev: {len(rows)} rows; exits {exits}; threads torch "
        f"{torch.get_num_threads()}, cpus {os.cpu_count()}; settings {len(settings)}",
        flush=True,
    )
    speed = early_exit_section(model, rows_by_size, logits_by_size, settings, pad_id, args.repeats)
    print(
        f"\n{'batch':>5} {'policy':>10} {'thresh':>7} {'layer x':>8} {'measured x':>10} "
        f"{'ratio':>6} {'target':>6}  ok  agree"
    )
    for r in speed:
        print(
            f"{r['batch_size']:>5} {r['policy']:>10} {r['threshold']:>7g} {r['layer_speedup']:>8.2f} "
            f"{r['measured_speedup']:>10.2f} {r['ratio']:>6.2f} {r['target']:>6} "
            f"{'yes' if r['meets_target'] else 'NO ':>3}  {r['runtime_agrees_with_offline']:.3f}"
        )

    onnx, onnx_note = [], "skipped (--skip-onnx)"
    if not args.skip_onnx:
        with tempfile.TemporaryDirectory(prefix="ee_onnx_") as tmp:
            try:
                paths, onnx_note = onnx_paths(args, model, rows, pad_id, Path(tmp))
                onnx = onnx_section(model, paths, rows[: args.onnx_examples], pad_id, args.repeats)
            except Exception as err:  # any exporter or onnxruntime failure: the figures above stand
                onnx_note = f"skipped: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        print(f"\nONNX, batch 1, {onnx_note}")
        if onnx:
            print(f"{'exit':>4} {'ort ms':>8} {'torch ms':>9} {'ort/torch':>9} {'max diff':>9}")
        for r in onnx:
            print(
                f"{r['exit']:>4} {r['onnxruntime_ms']:>8.2f} {r['torch_ms']:>9.2f} "
                f"{r['onnxruntime_over_torch']:>9.2f} {r['max_abs_diff']:>9.1e}"
            )

    import onnxruntime
    import transformers

    record = {
        "benchmark": "early_exit_speed",
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "setup": {
            "task": task.name,
            "model_dir": str(args.model),
            "model_type": model.encoder.config.model_type,
            "num_layers": model.num_layers,
            "exits": exits,
            "pooling": model.spec.pooling,
            "examples": {str(s): len(r) for s, r in rows_by_size.items()},
            "onnx_examples": min(args.onnx_examples, len(rows)),
            "repeats": args.repeats,
            "batching": "dev order, right-padded to each batch's longest",
            "targets": {f"batch{s}": t for s, t in TARGET_RATIO.items()},
        },
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__,
            "transformers": transformers.__version__,
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "machine": platform.machine(),
        },
        "early_exit": speed,
        "onnx_note": onnx_note,
        "onnx": onnx,
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp_out.replace(args.out)
    print(f"\nwrote {args.out} ({record['seconds']:.0f}s)")


if __name__ == "__main__":
    main()
