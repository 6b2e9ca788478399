"""Exit thresholds under drift, replayed offline: fixed, recalibrated and the full model.

The stream starts as SST-2 dev and shifts, phase by phase, to text the model never saw at
training, then comes back (``PHASES``): two SST-2 dev sentences of opposite labels joined
as "<A> , but <B>" (gold: B's label, since the clause after "but" carries the verdict; an
approximation, as a reader may weigh A more), SST-2 dev sentences joined two or three at a
time (same label, so the gold label stands; longer inputs), SST-2 dev with typos (a seeded
character edit in a fifth of the words; gold stands), CoLA sentences and MRPC sentences (no
sentiment gold: only agreement with the full model is measured there), and SST-2 dev again.

Every distinct text runs once through the export's ONNX segments (``onnx_runtime``: embeddings,
then every segment, no early exit; ``--threads``, one by default; ``--max-length`` tokens as
``serve`` reads them) for its logits at every exit. The replay then serves the stream, record by record,
three ways from those logits:

- ``fixed``: the export's default setting (its offline threshold) throughout;
- ``recalibrated``: the same policy, its threshold moved by ``early_exit.recalibrate``'s
  controller, fed by ``early_exit.shadow``'s sampler (fraction ``--fraction`` of the records,
  drawn before their exit is known; shadow work bounded to ``--share`` of the served layers).
  A picked record that left early costs the layers it skipped; its observation reaches the
  controller at once (a server's shadow queue would add a short delay);
- ``full``: every record to the last exit.

Cost is counted in layers (the export's exit layers): a record served at exit ``k`` costs
layer ``exits[k]``; the layer speed-up is the last exit's layer over the mean cost, served
alone and with the shadow layers added (the CPU the server spends). Per 1,000-record window:
accuracy against gold (phases that have it), agreement with the full model, both speed-ups,
and the threshold in force. The agreement target is ``recalibrate.target_agreement`` of the
export's budget, with the harm share bounded on the export's dev logits (``--harm dev``) or
the assumption-free worst case (``--harm 1``); the JSON's ``other_target`` replays the run
under the other one, ``window_rule_only`` without the controller's fast rule (``--recent``).
A sensitivity grid replays other fractions.

Targets: with recalibration, accuracy within the budget of the full model's in >= 95% of the
gold windows, at >= 90% of the fixed threshold's speed-up on the first (unshifted) phase; for
the fixed threshold, how far it breaks.

The offline setting is the export's ``default_setting``, or, with ``--curves``, the export's
rule applied to a sweep against the model's own last exit (``own_reference_setting``), or
``--policy``/``--threshold``. docs/drift.md reports the runs.

Usage (from the repository root, after ``dvc repro`` exports sst2/acl-cl; minutes)::

    python benchmarks/drift.py [--export models/sst2/acl-cl/export] [--glue-dir ../shared/glue]
        [--curves reports/sst2/acl-cl/curves.json] [--fraction 0.1] [--share 0.15]
        [--harm dev|1] [--recent 150] [--recent-min 50] [--policy P --threshold T]
        [--out benchmarks/results/drift_offline.json]
        [--figure reports/serve/drift_offline.png] [--cache drift_logits.npz]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import hashlib
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np

from aclpipe.atomic import write_text
from aclpipe.early_exit.onnx_runtime import OnnxEarlyExit, read_export
from aclpipe.early_exit.policies import exit_indices
from aclpipe.early_exit.recalibrate import (
    Controller,
    candidate_exits,
    harm_bound,
    target_agreement,
)
from aclpipe.early_exit.settings import BUDGET_POINTS
from aclpipe.early_exit.shadow import ShadowSampler, observe
from aclpipe.early_exit.tokens import encode, load_fast_tokenizer, pad
from aclpipe.host import machine
from aclpipe.layout import DEV_LOGITS, EXPORT_TOKENIZER

PHASES = (
    ("sst2", 4000),
    ("sst2-contrast", 4000),
    ("sst2-joined", 4000),
    ("sst2-typos", 4000),
    ("cola", 4000),
    ("mrpc", 4000),
    ("sst2", 4000),
)
WINDOW = 1000  # records per reported window
TYPO_RATE = 0.2  # share of words (3+ letters) given one character edit
TYPO_VARIANTS = 2  # noisy copies per dev sentence, cycled


def read_tsv(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def typo(text: str, rng: random.Random) -> str:
    """One character edit (swap, drop or double) in ``TYPO_RATE`` of the words."""
    words = text.split(" ")
    for i, word in enumerate(words):
        if len(word) < 3 or not word.isalpha() or rng.random() >= TYPO_RATE:
            continue
        j = rng.randrange(1, len(word) - 1)
        edit = rng.choice(("swap", "drop", "double"))
        if edit == "swap":
            word = word[: j - 1] + word[j] + word[j - 1] + word[j + 1 :]
        elif edit == "drop":
            word = word[:j] + word[j + 1 :]
        else:
            word = word[:j] + word[j] + word[j:]
        words[i] = word
    return " ".join(words)


def contrast(first: str, then: str) -> str:
    """``first`` and ``then`` joined as "<first> , but <then>" (SST-2's tokenised style:
    ``first``'s closing punctuation dropped, the comma spaced)."""
    return f"{first.rstrip(' .!?').rstrip()} , but {then}"


def sources(glue_dir: Path, seed: int) -> dict[str, list[tuple[str, int | None]]]:
    """Per phase kind, the texts it cycles through, with their gold label (None: no gold)."""
    rng = random.Random(seed)
    sst2 = [(row[0].strip(), int(row[1])) for row in read_tsv(glue_dir / "SST-2" / "dev.tsv")[1:]]
    by_label = {y: [t for t, label in sst2 if label == y] for y in (0, 1)}
    joined = []
    for _ in range(4000):
        label = rng.randrange(2)
        joined.append((" ".join(rng.sample(by_label[label], rng.choice((2, 3)))), label))
    pick, opposed = random.Random(seed + 2), []  # its own draws: the other phases as before
    for _ in range(4000):  # gold: the clause after "but" carries the verdict (approximately)
        label = pick.randrange(2)
        opposed.append((contrast(pick.choice(by_label[1 - label]), pick.choice(by_label[label])),
                        label))  # fmt: skip
    typos = [(typo(t, rng), y) for _ in range(TYPO_VARIANTS) for t, y in sst2]
    cola = [
        (row[3], None)
        for name in ("train", "dev")
        for row in read_tsv(glue_dir / "CoLA" / f"{name}.tsv")
    ]
    mrpc = sorted(
        {
            s
            for name in ("train", "dev")
            for row in read_tsv(glue_dir / "MRPC" / f"{name}.tsv")[1:]
            for s in row[3:5]
        }
    )
    return {
        "sst2": sst2,
        "sst2-contrast": opposed,
        "sst2-joined": joined,
        "sst2-typos": typos,
        "cola": cola,
        "mrpc": [(s, None) for s in mrpc],
    }


def build_stream(glue_dir: Path, phases, seed: int = 0) -> list[dict]:
    """Records ``{"text", "gold", "phase"}``: each phase cycles through its source, shuffled
    afresh on every pass (seeded)."""
    pools, rng, stream = sources(glue_dir, seed), random.Random(seed + 1), []
    for phase, count in phases:
        order: list[int] = []
        while len(order) < count:
            again = list(range(len(pools[phase])))
            rng.shuffle(again)
            order += again
        stream += [
            {"text": pools[phase][i][0], "gold": pools[phase][i][1], "phase": phase}
            for i in order[:count]
        ]
    return stream


def exit_logits(
    export: Path, texts: list[str], max_length: int, batch: int, threads: int = 1
) -> np.ndarray:
    """Logits ``[E, N, C]`` of every text at every exit through the ONNX segments (batches of
    similar length, so padding stays small)."""
    record = read_export(export)
    engine = OnnxEarlyExit(export, "none", None, threads=threads, record=record)
    tokenizer = load_fast_tokenizer(export / EXPORT_TOKENIZER, max_length)
    rows = encode(tokenizer, [(t, None) for t in texts])
    order = sorted(range(len(texts)), key=lambda i: len(rows[i]["input_ids"]))
    out = np.zeros((len(engine.exits), len(texts), int(record["num_labels"])), np.float32)
    for start in range(0, len(order), batch):
        picked = order[start : start + batch]
        run = engine.start(pad([rows[i] for i in picked], int(record.get("pad_id", 0))))
        for k in range(len(engine.exits)):
            out[k, picked] = run.logits(k)  # [b, C]
    return out


def replay(
    logits: np.ndarray,
    policy: str,
    offline: float,
    exit_layers: list[int],
    target: float,
    knobs: dict,
    fraction: float,
    share: float,
    burst: float,
    seed: int,
) -> dict:
    """Serve each record ``[E, N, C]`` three ways (module docstring); per-record exits,
    shadow layers and thresholds, and the controller's events."""
    num_exits, n = logits.shape[0], logits.shape[1]
    seen = [observe(logits[:, i], num_exits - 1) for i in range(n)]
    scores = np.array([o.scores(policy) for o in seen])  # [N, E]
    runs = np.array([o.runs() for o in seen], dtype=np.float64)
    fixed = candidate_exits(policy, np.array([offline]), scores, runs)[0]  # [N]
    check = min(n, 500)  # the vectorised exits are the policies' own (tests hold the rest)
    assert (fixed[:check] == exit_indices(policy, offline, logits[:, :check])).all()
    layers = np.asarray(exit_layers)
    control = Controller(policy, offline, list(exit_layers), target, **knobs)
    sampler = ShadowSampler(fraction, share, burst, seed)
    recal, shadow, threshold = np.zeros(n, np.int64), np.zeros(n), np.zeros(n)
    for i in range(n):
        threshold[i] = control.threshold
        k = int(
            candidate_exits(policy, threshold[i : i + 1], scores[i : i + 1], runs[i : i + 1])[0, 0]
        )
        recal[i] = k
        if sampler.pick():
            if k < num_exits - 1:
                shadow[i] = layers[-1] - layers[k]
                sampler.charge(shadow[i])
            control.observe(dataclasses.replace(seen[i], exit=k))
        sampler.served(float(layers[k]))
    return {
        "fixed": fixed,
        "recalibrated": recal,
        "shadow": shadow,
        "threshold": threshold,
        "events": control.events,
        "drawn": sampler.drawn,
        "refused": sampler.refused,
    }


def windows(logits, stream, result, exit_layers, budget: float) -> list[dict]:
    """Per ``WINDOW`` records: each server's accuracy (gold), agreement and speed-ups."""
    answers = logits.argmax(-1)  # [E, N]
    n, last = logits.shape[1], len(exit_layers) - 1
    layers = np.asarray(exit_layers, dtype=np.float64)
    exits = {
        "fixed": result["fixed"],
        "recalibrated": result["recalibrated"],
        "full": np.full(n, last),
    }
    out = []
    for start in range(0, n - WINDOW + 1, WINDOW):
        part = slice(start, start + WINDOW)
        gold = [r["gold"] for r in stream[part]]
        row = {
            "start": start,
            "phase": stream[start]["phase"],
            "threshold_at_end": float(result["threshold"][start + WINDOW - 1]),
        }
        idx = np.arange(start, start + WINDOW)
        for name, chosen in exits.items():
            given = answers[chosen[part], idx]
            cost = layers[chosen[part]]
            entry = {
                "agreement": float((given == answers[last, idx]).mean()),
                "layer_speedup": float(layers[-1] / cost.mean()),
            }
            if None not in gold:
                entry["accuracy"] = float((given == np.array(gold)).mean())
            if name == "recalibrated":
                entry["layer_speedup_with_shadow"] = float(
                    layers[-1] / (cost + result["shadow"][part]).mean()
                )
            row[name] = entry
        if None not in gold:
            floor = row["full"]["accuracy"] - budget / 100 - 1e-12
            for name in ("fixed", "recalibrated"):
                row[name]["within_budget"] = bool(row[name]["accuracy"] >= floor)
        out.append(row)
    return out


def summarize(rows: list[dict], budget: float, unshifted: int = PHASES[0][1]) -> dict:
    """Per server over the windows: the targets' figures; ``unshifted``: the records of the
    first (unshifted) phase."""
    gold = [r for r in rows if "accuracy" in r["full"]]
    first = [r for r in rows if r["start"] < unshifted]

    def mean(name: str, key: str, part: list[dict]) -> float:  # a live window may have none
        return float(np.mean([r[name][key] for r in part if r[name][key] is not None]))

    out = {}
    for name in ("fixed", "recalibrated"):
        out[name] = {
            "gold_windows": len(gold),
            "gold_windows_within_budget": sum(r[name]["within_budget"] for r in gold),
            "share_within_budget": round(
                float(np.mean([r[name]["within_budget"] for r in gold])), 4
            ),
            "worst_accuracy_drop_points": round(
                100 * max(r["full"]["accuracy"] - r[name]["accuracy"] for r in gold), 2
            ),
            "windows_agreement_at_least_1_minus_budget": int(
                sum(r[name]["agreement"] >= 1 - budget / 100 for r in rows)
            ),
            "lowest_agreement": round(min(r[name]["agreement"] for r in rows), 4),
            "unshifted_layer_speedup": round(mean(name, "layer_speedup", first), 3),
        }
    recal = out["recalibrated"]
    recal["unshifted_layer_speedup_with_shadow"] = round(
        mean("recalibrated", "layer_speedup_with_shadow", first), 3
    )
    fixed_speedup = out["fixed"]["unshifted_layer_speedup"]
    recal["unshifted_speedup_over_fixed"] = round(
        recal["unshifted_layer_speedup"] / fixed_speedup, 3
    )
    recal["unshifted_speedup_with_shadow_over_fixed"] = round(
        recal["unshifted_layer_speedup_with_shadow"] / fixed_speedup, 3
    )
    recal["targets"] = {
        "within_budget_share_>=_0.95": bool(recal["share_within_budget"] >= 0.95),
        "unshifted_speedup_>=_0.9_of_fixed": bool(recal["unshifted_speedup_over_fixed"] >= 0.9),
        "same_with_shadow_layers_counted": bool(
            recal["unshifted_speedup_with_shadow_over_fixed"] >= 0.9
        ),
    }
    return out


def phases_table(rows: list[dict], window: int = WINDOW) -> list[dict]:
    """Per phase (in stream order): each server's mean over its windows."""
    out: list[dict] = []
    for row in rows:
        if not out or out[-1]["phase"] != row["phase"] or out[-1]["until"] != row["start"]:
            out.append({"phase": row["phase"], "from": row["start"], "rows": []})
        out[-1]["rows"].append(row)
        out[-1]["until"] = row["start"] + window
    table = []
    for part in out:
        entry = {"phase": part["phase"], "records": [part["from"], part["until"]]}
        for name in ("fixed", "recalibrated", "full"):
            keys = [k for k in part["rows"][0][name] if k != "within_budget"]
            entry[name] = {
                k: round(
                    float(np.mean([r[name][k] for r in part["rows"] if r[name][k] is not None])), 4
                )
                for k in keys
            }
        table.append(entry)
    return table


def plot(
    rows: list[dict], result: dict, target: float, budget: float, path: Path, window: int = WINDOW
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mid = [r["start"] + window / 2 for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True)
    for name, style in (("fixed", "s-"), ("recalibrated", "o-")):
        axes[0].plot(mid, [r[name]["agreement"] for r in rows], style, label=name)
        drops = [
            100 * (r["full"]["accuracy"] - r[name]["accuracy"]) if "accuracy" in r[name] else np.nan
            for r in rows
        ]
        axes[1].plot(mid, drops, style, label=name)
        axes[2].plot(mid, [r[name]["layer_speedup"] for r in rows], style, label=f"{name}")
    axes[2].plot(
        mid,
        [r["recalibrated"]["layer_speedup_with_shadow"] for r in rows],
        "o--",
        label="recalibrated, shadow layers counted",
    )
    if "cpu_speedup" in rows[0]["fixed"]:  # a live run: the servers' CPU seconds, measured
        for name, style in (("fixed", "s:"), ("recalibrated", "o:")):
            axes[2].plot(mid, [r[name]["cpu_speedup"] for r in rows], style,
                         label=f"{name}, CPU seconds (full / this)")  # fmt: skip
    axes[0].axhline(target, color="grey", ls=":", lw=1, label=f"target {target:.3f}")
    axes[1].axhline(budget, color="grey", ls=":", lw=1, label=f"budget {budget:g} point")
    twin = axes[0].twinx()
    twin.plot(
        np.arange(len(result["threshold"])),
        result["threshold"],
        color="tab:green",
        lw=0.8,
        alpha=0.6,
    )
    twin.set_ylabel("recalibrated threshold", color="tab:green")
    axes[0].set(ylabel="agreement with full model", title="per 1,000-record window")
    axes[1].set(ylabel="accuracy drop vs full (points)")
    axes[2].set(ylabel="speed-up over the full model", xlabel="record in stream")
    for ax in axes:
        ax.grid(alpha=0.3)
        for r in rows:
            if r["start"] and r["phase"] != rows[rows.index(r) - 1]["phase"]:
                ax.axvline(r["start"], color="black", lw=0.6)
    for r in rows:
        if not r["start"] or r["phase"] != rows[rows.index(r) - 1]["phase"]:
            axes[2].annotate(r["phase"], (r["start"], 0.02), xycoords=("data", "axes fraction"),
                             fontsize=8)  # fmt: skip
    axes[0].legend(fontsize=8, loc="lower left")
    axes[2].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    fig.savefig(tmp, dpi=110, format="png")
    os.replace(tmp, path)


def moves(events) -> dict:
    """A replay's moves by rule, and the first of each (observations seen)."""
    out: dict = {"total": len(events)}
    for rule in ("fast", "window"):
        mine = [e for e in events if e.rule == rule]
        out[rule] = len(mine)
        out[f"first_{rule}_seen"] = mine[0].seen if mine else None
    return out


def own_reference_setting(curves_path: Path, budget: float) -> dict:
    """The export's rule (``settings.choose_default``: the highest layer speed-up within the
    budget, ties to the higher score) with the model's own last exit as the reference instead
    of ce's, on the sweep's validation split when it has one."""
    curves = json.loads(curves_path.read_text(encoding="utf-8"))
    chosen_on = curves.get("validation") or curves
    reference = chosen_on["full_model"]["score"]
    admitted = [p for p in chosen_on["points"] if p["score"] >= reference - budget / 100 - 1e-9]
    best = max(admitted, key=lambda p: (p["layer_speedup"], p["score"]))
    return {
        "policy": best["policy"],
        "threshold": best["threshold"],
        "source": "own reference",
        "budget_points": budget,
        "reference_score": reference,
        "score": best["score"],
        "layer_speedup": best["layer_speedup"],
        "split": "validation" if curves.get("validation") else "dev",
    }


def offline_setting(
    record: dict, curves: Path | None, policy: str | None, threshold: float | None
) -> dict:
    """The fixed threshold: the export's ``default_setting``; with ``curves``, the export's
    rule against the model's own last exit (``own_reference_setting``); with ``policy``, that
    policy at ``threshold``. Exits when it exits nowhere early."""
    setting = record["default_setting"]
    if curves:
        setting = own_reference_setting(curves, setting.get("budget_points", BUDGET_POINTS))
    if policy:
        setting = {"policy": policy, "threshold": threshold, "source": "--policy"}
    if setting["policy"] not in ("confidence", "entropy", "patience"):
        sys.exit(f"the setting {setting} exits nowhere early: give --policy and --threshold")
    return setting


def load_logits(args, record: dict, texts: list[str]) -> tuple[np.ndarray, float]:
    """Per distinct text, its logits at every exit (from ``--cache`` when it holds these)."""
    key = hashlib.sha256(
        json.dumps([record.get("segments"), args.max_length, texts]).encode()
    ).hexdigest()
    if args.cache and args.cache.is_file():
        cached = np.load(args.cache)
        if str(cached["key"]) == key:
            return cached["logits"], float(cached["seconds"])
    began = time.perf_counter()
    logits = exit_logits(args.export, texts, args.max_length, args.batch, args.threads)
    seconds = time.perf_counter() - began
    if args.cache:
        np.savez(args.cache, key=key, logits=logits, seconds=seconds)
    return logits, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, default=Path("models/sst2/acl-cl/export"))
    parser.add_argument("--glue-dir", type=Path, default=Path("../shared/glue"))
    parser.add_argument("--max-length", type=int, default=128, help="tokens, as serve reads")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads (logits)")
    parser.add_argument("--policy", help="the offline setting (default: the export's)")
    parser.add_argument("--threshold", type=float, help="and its threshold")
    parser.add_argument(
        "--curves",
        type=Path,
        help="pick the setting from this sweep against "
        "the model's own last exit (default: the export's default_setting)",
    )
    parser.add_argument("--fraction", type=float, default=0.1, help="shadow fraction F")
    parser.add_argument("--share", type=float, default=0.15, help="shadow layers / served layers")
    parser.add_argument("--burst", type=float, default=60.0, help="token bucket, in layers")
    parser.add_argument("--harm", choices=("dev", "1"), default="dev")
    parser.add_argument("--window", type=int, default=500, help="controller window (records)")
    parser.add_argument("--min-window", type=int, default=150)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--recent", type=int, default=150, help="fast rule's sample; 0: off")
    parser.add_argument("--recent-min", type=int, default=50, help="no fast move on fewer")
    parser.add_argument("--grid", default="0.05,0.1,0.2,0.3", help="fractions also replayed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, help="npz of the per-exit logits, reused if same")
    parser.add_argument("--note", default="", help="how the export was made, recorded")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/drift_offline.json"))
    parser.add_argument("--figure", type=Path, default=Path("reports/serve/drift_offline.png"))
    args = parser.parse_args()
    began = time.perf_counter()
    record = read_export(args.export)
    setting = offline_setting(record, args.curves, args.policy, args.threshold)
    policy, offline = setting["policy"], float(setting["threshold"])
    budget = float(setting.get("budget_points", BUDGET_POINTS))
    exit_layers = list(record["exits"])
    stream = build_stream(args.glue_dir, PHASES, args.seed)
    texts = sorted({r["text"] for r in stream})
    unique, seconds = load_logits(args, record, texts)
    where = {t: i for i, t in enumerate(texts)}
    logits = unique[:, [where[r["text"]] for r in stream]]  # [E, N, C]
    dev = np.load(args.export / DEV_LOGITS)
    dev_exits = exit_indices(policy, offline, dev["logits"])
    dev_answers = dev["logits"].argmax(-1)  # [E, N]
    harm = (
        1.0
        if args.harm == "1"
        else harm_bound(
            dev_answers[dev_exits, np.arange(len(dev_exits))], dev_answers[-1], dev["labels"]
        )
    )
    target = target_agreement(budget, harm)
    knobs = {"window": args.window, "min_window": args.min_window, "every": args.every,
             "recent": args.recent, "recent_min": args.recent_min}  # fmt: skip
    runs = {}
    for fraction in sorted({args.fraction, *map(float, args.grid.split(","))}):
        result = replay(
            logits,
            policy,
            offline,
            exit_layers,
            target,
            knobs,
            fraction,
            args.share,
            args.burst,
            args.seed,
        )
        rows = windows(logits, stream, result, exit_layers, budget)
        runs[fraction] = (result, rows, summarize(rows, budget))
        print(f"F={fraction}: {json.dumps(runs[fraction][2]['recalibrated'])}", file=sys.stderr)
    result, rows, summary = runs[args.fraction]
    # the same run under the other target: assumption-free (harm 1) beside the dev estimate
    other_harm = harm if args.harm == "1" else 1.0
    other = replay(
        logits,
        policy,
        offline,
        exit_layers,
        target_agreement(budget, other_harm),
        knobs,
        args.fraction,
        args.share,
        args.burst,
        args.seed,
    )
    other_rows = windows(logits, stream, other, exit_layers, budget)
    # the same run without the fast rule: what it changes
    alone = replay(logits, policy, offline, exit_layers, target, {**knobs, "recent": 0},
                   args.fraction, args.share, args.burst, args.seed)  # fmt: skip
    alone_rows = windows(logits, stream, alone, exit_layers, budget)
    out = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "export": {
            "task": record.get("task"),
            "exits": exit_layers,
            "default_setting": setting,
            "note": args.note,
        },
        "machine": machine(),
        "stack": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "onnxruntime": __import__("onnxruntime").__version__,
        },
        "phases": [list(p) for p in PHASES],
        "distinct_texts": len(texts),
        "logits_seconds": round(seconds, 1),
        "logits_threads": args.threads,
        "max_length": args.max_length,
        "budget_points": budget,
        "harm": {"source": args.harm, "value": round(harm, 4)},
        "target_agreement": round(target, 4),
        "controller": {**knobs, "confidence": 0.95, "hysteresis": 0.005, "max_step": 0.05},
        "shadow": {
            "fraction": args.fraction,
            "share": args.share,
            "burst_layers": args.burst,
            "drawn": result["drawn"],
            "refused": result["refused"],
        },
        "summary": summary,
        "phases_table": phases_table(rows),
        "windows": rows,
        "moves": moves(result["events"]),
        "events": [e.as_dict() for e in result["events"]],
        "fraction_grid": {
            str(f): {"summary": s["recalibrated"], "moves": moves(r["events"])}
            for f, (r, _, s) in runs.items()
        },
        "other_target": {
            "harm": round(other_harm, 4),
            "target_agreement": round(target_agreement(budget, other_harm), 4),
            "summary": summarize(other_rows, budget)["recalibrated"],
            "moves": moves(other["events"]),
            "phases_table": [
                {"phase": p["phase"], "recalibrated": p["recalibrated"]}
                for p in phases_table(other_rows)
            ],
        },
        "window_rule_only": {
            "summary": summarize(alone_rows, budget)["recalibrated"],
            "moves": moves(alone["events"]),
            "phases_table": [
                {"phase": p["phase"], "recalibrated": p["recalibrated"]}
                for p in phases_table(alone_rows)
            ],
            "windows": [
                {"start": r["start"], "phase": r["phase"], "recalibrated": r["recalibrated"]}
                for r in alone_rows
            ],
        },
        "wall_seconds": round(time.perf_counter() - began, 1),
    }
    write_text(args.out, json.dumps(out, indent=2) + "\n")
    plot(rows, result, target, budget, args.figure)
    print(json.dumps({"target_agreement": target, "harm": harm, **summary}, indent=2))


if __name__ == "__main__":
    main()
