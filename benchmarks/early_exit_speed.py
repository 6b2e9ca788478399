"""Early exit in PyTorch: measured speed-up over layer speed-up.

A trained multi-exit model (``aclpipe finetune``) on its task's dev split (``aclpipe prepare``).

1. Early exit. For each policy (entropy, confidence, patience) up to three thresholds, picked
   from the model's own dev logits so that the layer speed-up spans light to heavy exiting
   (near 1.5x, 2.2x and 3.2x, inside 1.3x to 4x; patience only has whole t, at most E/(t+1)x,
   and patience 3 is always among them when the model has more than 3 exits).
   Per setting and batch size (1 and 32):

   - layer speed-up = ``L * N / sum(exit layers)``, the policy applied to the all-exit logits
     of the timed examples (``L`` = the deepest exit, the layers ``full_forward`` runs);
   - measured speed-up = ``full_forward`` time / ``EarlyExitRuntime`` time on the same batches;
   - their ratio, against the targets: at least 0.9 at batch 1 and
     at least 0.8 at batch 32 (per-sample exit with a shrinking batch).

   Calls are interleaved batch by batch (full model and every setting on batch j, in an order
   that rotates, then batch j+1), so machine noise falls on all of them alike; one untimed
   pass warms up, and each figure is the median over the repeats of the pass total. Beside
   the wall-clock ratio the process CPU-time ratio is printed: with one thread (the default
   here, ``--threads``) it is the steadier one when other jobs share the cores.

ONNX Runtime, and the whole predict path, are ``benchmarks/predict_throughput.py``'s.

Absolute times drift on a shared machine; the ratios, measured side by side, are the figures.

    python benchmarks/early_exit_speed.py [--model models/sst2/acl-cl] [--data data/sst2]
        [--examples 200] [--examples-batched 320] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from threads import add_threads_option, apply_threads  # noqa: E402

from aclpipe.data.prepared import load_meta, load_split  # noqa: E402
from aclpipe.data.tasks import get_task  # noqa: E402
from aclpipe.early_exit.policies import exit_indices  # noqa: E402
from aclpipe.early_exit.runtime import EarlyExitRuntime, full_forward  # noqa: E402
from aclpipe.evaluation.scoring import all_exit_logits  # noqa: E402
from aclpipe.modeling.batching import collate  # noqa: E402
from aclpipe.modeling.model import MultiExitModel, load_multi_exit  # noqa: E402

POLICIES = ("entropy", "confidence", "patience")
TARGET_SPEEDUPS = (1.5, 2.2, 3.2)  # light, medium, heavy exiting (layer speed-up)
SPEEDUP_RANGE = (1.3, 4.0)
TARGET_RATIO = {1: 0.9, 32: 0.8}  # measured / layer speed-up, at least
PATIENCE_ALWAYS = 3  # timed whatever its speed-up: the runtime once lost history from t = 3 on


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
    chosen = set(inside or speedups)
    if policy == "patience" and len(exits) > PATIENCE_ALWAYS:  # t <= E - 1
        t = float(PATIENCE_ALWAYS)
        speedups.setdefault(t, layer_speedup(logits, exits, policy, t))
        chosen.add(t)
    return sorted(chosen, key=speedups.get)


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
    """Per call, the wall-clock and the process CPU seconds of each full pass over ``batches``
    (``{"wall": {name: [repeats]}, "cpu": ..., "outputs": {name: [warm-up output per batch]}}``).

    Batch by batch, every call runs once, in an order rotated per batch and repeat. CPU time
    leaves out the time this process waits for a core other jobs hold; with one thread it is the
    steadier of the two on a shared machine (wall-clock is the figure docs/methods.md asks for).
    """
    names = list(calls)
    outputs = {name: [calls[name](**batch) for batch in batches] for name in names}  # warm-up
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            spent_wall, spent_cpu = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0.0)
            for j, batch in enumerate(batches):
                shift = (j + r) % len(names)
                for name in names[shift:] + names[:shift]:
                    wall_0, cpu_0 = time.perf_counter(), time.process_time()
                    calls[name](**batch)
                    spent_cpu[name] += time.process_time() - cpu_0
                    spent_wall[name] += time.perf_counter() - wall_0
            for name in names:
                wall[name].append(spent_wall[name])
                cpu[name].append(spent_cpu[name])
    finally:
        gc.enable()
    return {"wall": wall, "cpu": cpu, "outputs": outputs}


def early_exit_section(
    model: MultiExitModel,
    rows_by_size: dict[int, list[dict]],
    logits_by_size: dict[int, np.ndarray],
    settings: list[tuple[str, float]],
    pad_id: int,
    repeats: int,
) -> list[dict]:
    """One record per batch size and setting (keys as printed, plus the seconds)."""
    exits = model.spec.exits
    results = []
    for size, rows in rows_by_size.items():
        batches = make_batches(rows, size, pad_id)
        runtimes = {f"{p} {t:g}": EarlyExitRuntime(model, p, t) for p, t in settings}
        calls: dict[str, Callable] = {"full": lambda **b: full_forward(model, **b), **runtimes}
        if size == 1:  # the oracle: each sample's exit known in advance (see ``oracle_call``)
            for policy, threshold in settings:
                chosen = exit_indices(policy, threshold, logits_by_size[size])  # [N]
                calls[f"oracle {policy} {threshold:g}"] = oracle_call(model, batches, chosen)
        with torch.inference_mode():
            timed = time_interleaved(calls, batches, repeats)
        wall = {name: statistics.median(v) for name, v in timed["wall"].items()}
        cpu = {name: statistics.median(v) for name, v in timed["cpu"].items()}
        for policy, threshold in settings:
            name = f"{policy} {threshold:g}"
            layer = layer_speedup(logits_by_size[size], exits, policy, threshold)
            offline = exit_indices(policy, threshold, logits_by_size[size])  # [N]
            online = torch.cat([out.exit_index for out in timed["outputs"][name]]).numpy()
            online_layers = np.asarray(exits)[online]
            measured = wall["full"] / wall[name]
            paired = [f / e / layer for f, e in zip(timed["wall"]["full"], timed["wall"][name])]
            oracle = wall.get(f"oracle {name}")
            floor = (
                {
                    "oracle_speedup": round(wall["full"] / oracle, 3),
                    "oracle_ratio": round(wall["full"] / oracle / layer, 3),
                    "runtime_over_oracle": round(wall[name] / oracle, 3),
                }
                if oracle
                else {}
            )
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
                    "ratio_per_repeat": [round(x, 3) for x in paired],
                    "cpu_speedup": round(cpu["full"] / cpu[name], 3),
                    "cpu_ratio": round(cpu["full"] / cpu[name] / layer, 3),
                    "runtime_agrees_with_offline": round(float((online == offline).mean()), 4),
                    "runtime_layer_speedup": round(
                        exits[-1] * len(online) / float(online_layers.sum()), 3
                    ),
                    "seconds_full": round(wall["full"], 4),
                    "seconds_early_exit": round(wall[name], 4),
                    **floor,
                }
            )
    return results


def oracle_call(model: MultiExitModel, batches: list[dict], chosen: np.ndarray) -> Callable:
    """Batch 1: a call that runs each sample straight to the exit the policy will pick (the
    embeddings, the layers up to that exit, and that exit's head only; ``full_forward`` with
    ``exit_index``). It is the floor for any early-exit runtime on this model code: what is
    left between it and the full model is the fixed cost of a forward (embeddings, mask, one
    head), and what is left between the runtime and it is the runtime's own cost (the heads
    and policy checks of the exits a sample passes)."""
    exit_of = {id(batch["input_ids"]): int(k) for batch, k in zip(batches, chosen)}
    return lambda **b: full_forward(model, **b, exit_index=exit_of[id(b["input_ids"])])


# --- report ----------------------------------------------------------------------------------


def print_speed(speed: list[dict]) -> None:
    print(
        f"\n{'batch':>5} {'policy':>10} {'thresh':>7} {'layer x':>8} {'measured x':>10} "
        f"{'ratio':>6} {'target':>6}  ok {'cpu x':>6} {'cpu ratio':>9}  agree "
        f"{'oracle ratio':>12} {'time/oracle':>11}"
    )
    for r in speed:
        oracle = (
            f"{r['oracle_ratio']:>12.2f} {r['runtime_over_oracle']:>11.3f}"
            if "oracle_ratio" in r
            else f"{'-':>12} {'-':>11}"
        )
        print(
            f"{r['batch_size']:>5} {r['policy']:>10} {r['threshold']:>7g} "
            f"{r['layer_speedup']:>8.2f} {r['measured_speedup']:>10.2f} {r['ratio']:>6.2f} "
            f"{r['target']:>6} {'yes' if r['meets_target'] else 'NO ':>3} "
            f"{r['cpu_speedup']:>6.2f} {r['cpu_ratio']:>9.2f}  "
            f"{r['runtime_agrees_with_offline']:.3f} {oracle}"
        )
    for size, line in summary(speed).items():
        print(
            f"{size}: ratio {line['min_ratio']:.2f}..{line['max_ratio']:.2f} (cpu "
            f"{line['min_cpu_ratio']:.2f}..{line['max_cpu_ratio']:.2f}), "
            f"{line['settings_meeting_target']}/{line['settings']} settings meet {line['target']}"
            + (
                f"; oracle ratio {line['min_oracle_ratio']:.2f}..{line['max_oracle_ratio']:.2f}, "
                f"runtime / oracle time {line['min_runtime_over_oracle']:.3f}.."
                f"{line['max_runtime_over_oracle']:.3f}"
                if "min_oracle_ratio" in line
                else ""
            )
        )


def summary(speed: list[dict]) -> dict:
    """Per batch size: the range of the ratios and how many settings meet the target."""
    out = {}
    for size in sorted({r["batch_size"] for r in speed}):
        rows = [r for r in speed if r["batch_size"] == size]
        out[f"batch{size}"] = {
            "target": TARGET_RATIO.get(size),
            "settings": len(rows),
            "settings_meeting_target": sum(r["meets_target"] for r in rows),
            "min_ratio": min(r["ratio"] for r in rows),
            "max_ratio": max(r["ratio"] for r in rows),
            "min_cpu_ratio": min(r["cpu_ratio"] for r in rows),
            "max_cpu_ratio": max(r["cpu_ratio"] for r in rows),
        }
        if all("oracle_ratio" in r for r in rows):
            out[f"batch{size}"].update(
                min_oracle_ratio=min(r["oracle_ratio"] for r in rows),
                max_oracle_ratio=max(r["oracle_ratio"] for r in rows),
                min_runtime_over_oracle=min(r["runtime_over_oracle"] for r in rows),
                max_runtime_over_oracle=max(r["runtime_over_oracle"] for r in rows),
            )
    return out


def versions(*packages: str) -> dict[str, str]:
    from importlib import metadata

    found = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


# --- main ------------------------------------------------------------------------------------


def load_dev_logits(args, rows: int, exits: list[int]) -> np.ndarray | None:
    """All-exit dev logits ``[E, N, C]`` from ``aclpipe export``'s dev_logits.npz, if it is there
    and matches this model and split."""
    path = args.model / "export" / "dev_logits.npz"
    if not path.exists():
        return None
    with np.load(path) as saved:
        logits, saved_exits = saved["logits"], saved["exits"].tolist()
    return logits if saved_exits == exits and logits.shape[1] == rows else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/sst2/acl-cl"))
    parser.add_argument("--data", type=Path, default=Path("data/sst2"))
    parser.add_argument("--examples", type=int, default=150, help="dev examples at batch 1")
    parser.add_argument(
        "--examples-batched",
        type=int,
        default=256,
        help="dev examples at batch 32 (872: all of SST-2 dev, ~3x longer)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    add_threads_option(parser)
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/early_exit_speed.json")
    )
    args = parser.parse_args()
    started = time.perf_counter()
    apply_threads(args.threads)

    task = get_task(load_meta(args.data)["task"])
    if task.is_regression:
        sys.exit(f"{task.name} is a regression task: this benchmark times classification exits")
    model = load_multi_exit(args.model).eval()
    rows = load_split(args.data, task.dev_splits[0][0])
    pad_id = model.encoder.config.pad_token_id or 0
    exits = model.spec.exits
    dev_logits = load_dev_logits(args, len(rows), exits)
    if dev_logits is None:
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
    print_speed(speed)
    print(f"({time.perf_counter() - started:.0f}s)", flush=True)

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
            "repeats": args.repeats,
            "batching": "dev order, right-padded to each batch's longest",
            "targets": {f"batch{s}": t for s, t in TARGET_RATIO.items()},
        },
        "environment": {
            "python": platform.python_version(),
            **versions("torch", "onnxruntime", "transformers"),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "machine": platform.machine(),
        },
        "summary": summary(speed),
        "early_exit": speed,
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp_out.replace(args.out)
    print(f"\nwrote {args.out} ({record['seconds']:.0f}s)")


if __name__ == "__main__":
    main()
