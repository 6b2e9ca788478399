"""The STS study's report: reports/sts/README.md, results.json and the per-layer figure,
generated from sts/runs/ (``aclpipe sts report``).

Verdicts follow METHODS.md "Comparisons": for "A beats B" on a split, the mean over seeds of
``Spearman(A_s) - Spearman(B_s)`` with a 95% interval from the paired bootstrap of
``study.paired`` (seeds and sentence pairs resampled together, 2,000 resamples), the
one-sided p-value and better / worse / no detectable difference. A resample of sentence
pairs is a count vector; the Spearman correlation of the resampled pairs is computed from
the counts (:func:`weighted_spearman`: average ranks of the replicated sample, then the
count-weighted Pearson correlation of the ranks), so it equals ``scipy.stats.spearmanr`` of
the pairs repeated as drawn. The untrained checkpoint is one fixed run: against it, a
trained pooling is compared on the same resamples with the checkpoint's own value in each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aclpipe import atomic
from aclpipe.data.tasks import get_task
from aclpipe.errors import UserError
from aclpipe.layout import META, REPORTS_README, RESULTS_JSON
from aclpipe.study.paired import RESAMPLES, paired_bootstrap
from aclpipe.study.sts_eval import POOLINGS
from aclpipe.study.sts_study import COSINES, RUN_RECORD, StsStudy

README = REPORTS_README
RESULTS = RESULTS_JSON
FIGURE = "spearman_per_layer.png"
COMPARISONS = (("layer-attention", "mean"), ("layer-attention", "cls"))


def weighted_ranks(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Average ranks (1-based, ties sharing their mean rank) of ``values [N]`` in the sample
    that repeats item ``i`` ``weights[r, i]`` times, for each row ``r``: ``[R, N]``."""
    weights = np.atleast_2d(np.asarray(weights, dtype=np.float64))  # [R, N]
    order = np.argsort(values, kind="stable")
    ordered = np.asarray(values)[order]
    starts = np.r_[True, ordered[1:] != ordered[:-1]]  # [N], a new tie group begins
    group = np.cumsum(starts) - 1  # [N]
    ends = np.r_[np.nonzero(starts)[0][1:] - 1, len(ordered) - 1]  # [G], each group's last
    cumulative = np.cumsum(weights[:, order], axis=1)[:, ends]  # [R, G]
    totals = np.diff(cumulative, axis=1, prepend=0.0)  # [R, G], copies in each group
    average = cumulative - totals + (totals + 1) / 2  # [R, G]
    ranks = np.empty_like(weights)
    ranks[:, order] = average[:, group]
    return ranks


def weighted_spearman(values: np.ndarray, gold: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Spearman correlation of ``values`` with ``gold`` in each resample ``weights [R, N]``
    (0 where either side is constant, as ``metrics``): ``[R]``."""
    weights = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    a, b = weighted_ranks(values, weights), weighted_ranks(gold, weights)
    total = weights.sum(axis=1, keepdims=True)
    a = a - (weights * a).sum(axis=1, keepdims=True) / total
    b = b - (weights * b).sum(axis=1, keepdims=True) / total
    covariance = (weights * a * b).sum(axis=1)
    scale = np.sqrt((weights * a * a).sum(axis=1) * (weights * b * b).sum(axis=1))
    return np.where(scale > 0, covariance / np.maximum(scale, 1e-300), 0.0)


@dataclass
class SpearmanMeasure:
    """One run's Spearman on a split under bootstrap weights (``paired``'s Measure API)."""

    cosines: np.ndarray  # [N]
    cost_range: tuple[float, float] = (0.0, 1.0)

    def values(self, task, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return weighted_spearman(self.cosines, labels, weights)


def load_runs(study: StsStudy) -> tuple[dict, dict]:
    """``(runs, zero_shot)``: ``runs[(objective, pooling)][seed] = (record, cosines)``."""
    zero_dir = study.zero_shot_dir()
    if not (zero_dir / COSINES).is_file():
        raise UserError(f"{zero_dir} not found: run `aclpipe sts zero-shot` first")
    zero = {
        "record": json.loads((zero_dir / RUN_RECORD).read_text(encoding="utf-8")),
        "cosines": dict(np.load(zero_dir / COSINES)),
    }
    runs: dict = {}
    for objective in study.objectives:
        for pooling in study.poolings:
            for seed in study.seeds:
                folder = study.run_dir(objective, pooling, seed)
                if (folder / COSINES).is_file():
                    record = json.loads((folder / RUN_RECORD).read_text(encoding="utf-8"))
                    runs.setdefault((objective, pooling), {})[seed] = (
                        record,
                        dict(np.load(folder / COSINES)),
                    )
    return runs, zero


def summarise(study: StsStudy, runs: dict, zero: dict, resamples: int = RESAMPLES) -> dict:
    """Every number the README shows (results.json)."""
    task = get_task("stsb")
    num_layers = zero["cosines"]["layers_dev"].shape[1]
    out: dict = {"model": zero["record"]["model"], "splits": {}, "resamples": resamples}
    for split in ("dev", "test"):
        gold = zero["cosines"][f"gold_{split}"]
        zero_layers = zero["cosines"][f"layers_{split}"]  # [P, L, N]
        zero_final = {
            p: float(weighted_spearman(zero_layers[i, -1], gold, np.ones(len(gold)))[0])
            for i, p in enumerate(POOLINGS)
        }
        section: dict = {
            "pairs": len(gold),
            "zero_shot_per_layer": {
                p: [
                    float(weighted_spearman(c, gold, np.ones(len(gold)))[0]) for c in zero_layers[i]
                ]
                for i, p in enumerate(POOLINGS)
            },
            "zero_shot": zero_final,
            "runs": {},
            "verdicts": {},
            "against_zero_shot": {},
            "against_checkpoint_mean": {},
        }
        measures = {}
        for (objective, pooling), seeds in runs.items():
            per_seed = {s: SpearmanMeasure(c[f"trained_{split}"]) for s, (_, c) in seeds.items()}
            measures[(objective, pooling)] = per_seed
            values = [float(m.values(task, gold, np.ones(len(gold)))[0]) for m in per_seed.values()]
            mean_index = POOLINGS.index("mean")
            per_layer = [  # per seed: mean pooling at each layer of the trained encoder
                [float(weighted_spearman(c, gold, np.ones(len(gold)))[0])
                 for c in cosines[f"layers_{split}"][mean_index]]
                for _, cosines in seeds.values()
            ]  # fmt: skip
            section["runs"][f"{objective}/{pooling}"] = {
                "seeds": sorted(seeds),
                "spearman": values,
                "mean": float(np.mean(values)),
                "sd": float(np.std(values, ddof=1)) if len(values) > 1 else None,
                "train_seconds": [r["train_seconds"] for r, _ in seeds.values()],
                "encoder_per_layer_mean_pooling": np.mean(per_layer, axis=0).tolist(),
            }
            zero_measure = SpearmanMeasure(zero_layers[POOLINGS.index(pooling), -1])
            section["against_zero_shot"][f"{objective}/{pooling}"] = paired_bootstrap(
                task, per_seed, {s: zero_measure for s in per_seed}, gold, resamples
            )
            published = SpearmanMeasure(zero_layers[POOLINGS.index("mean"), -1])
            section["against_checkpoint_mean"][f"{objective}/{pooling}"] = paired_bootstrap(
                task, per_seed, {s: published for s in per_seed}, gold, resamples
            )
        for objective in study.objectives:
            for a, b in COMPARISONS:
                if (objective, a) in measures and (objective, b) in measures:
                    section["verdicts"][f"{objective}: {a} - {b}"] = paired_bootstrap(
                        task, measures[(objective, a)], measures[(objective, b)], gold, resamples
                    )
        out["splits"][split] = section
    out["layers"] = list(range(1, num_layers + 1))
    out["runs_present"] = sum(len(seeds) for seeds in runs.values())
    out["runs_planned"] = len(study.objectives) * len(study.poolings) * len(study.seeds)
    return out


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def _verdict_row(name: str, v: dict) -> str:
    if not v.get("seeds"):
        return f"| {name} | no common seed | | | |"
    return (
        f"| {name} | {100 * v['difference']:+.2f} | [{100 * v['low']:+.2f}, {100 * v['high']:+.2f}] "
        f"| {v['p']:.3f} | {v['verdict']} ({_seeds(len(v['seeds']))}) |"
    )


def _seeds(n: int) -> str:
    return "1 seed: examples only" if n == 1 else f"{n} seeds"


def render_readme(study: StsStudy, summary: dict, meta: dict) -> str:
    """The study's README (``aclpipe sts report``)."""
    lines = [
        "# Layer-wise attention pooling on STS: contrastive sentence embeddings (claim L2)",
        "",
        "Generated by `aclpipe sts report` from `sts/runs/` (`dvc repro sts/dvc.yaml`); do not "
        "edit by hand. Objectives, data and pooling: docs/sentence_embeddings.md.",
        "",
        f"Model: `{summary['model']}`. Spearman x100 of the cosine similarity of the two "
        "sentences' embeddings against the gold scores, on STS-B dev "
        f"({summary['splits']['dev']['pairs']} pairs) and the STS Benchmark test "
        f"({summary['splits']['test']['pairs']} pairs, `original/sts-test.tsv`). No model "
        "selection: each run's final model is scored once on each.",
        "",
        f"Runs present: {summary['runs_present']} of {summary['runs_planned']} planned "
        f"({len(study.objectives)} objectives x {len(study.poolings)} poolings x "
        f"{len(study.seeds)} seeds).",
        "",
    ]
    for name, m in meta.items():
        lines.append(f"- `{name}` data: {json.dumps(m.get('built'))}; train rows used: "
                     f"{m['splits']['train']['examples']}")  # fmt: skip
    lines += ["", "## Scores (mean ± sd over seeds)", ""]
    lines += ["| objective | pooling | seeds | dev | test | untrained checkpoint, same pooling (dev / test) |",
              "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    dev, test = summary["splits"]["dev"], summary["splits"]["test"]
    for objective in study.objectives:
        for pooling in study.poolings:
            key = f"{objective}/{pooling}"
            if key not in dev["runs"]:
                lines.append(f"| {objective} | {pooling} | 0 | not run | not run | |")
                continue
            d, t = dev["runs"][key], test["runs"][key]
            sd = lambda r: "" if r["sd"] is None else f" ± {100 * r['sd']:.2f}"  # noqa: E731
            lines.append(
                f"| {objective} | {pooling} | {len(d['seeds'])} | {_pct(d['mean'])}{sd(d)} | "
                f"{_pct(t['mean'])}{sd(t)} | {_pct(dev['zero_shot'][pooling])} / "
                f"{_pct(test['zero_shot'][pooling])} |"
            )
    lines += [
        "",
        "The untrained checkpoint's poolings are parameter-free (`cls`: the raw [CLS] vector; "
        "`layer-attention`: attention over layers with identity maps, study/sts_eval.py); the "
        "trained ones carry their learned maps. all-MiniLM-L6-v2 was itself trained "
        "contrastively on about a billion sentence pairs with mean pooling, so its zero-shot "
        "mean pooling is a strong baseline: every trained run is also compared with it (the "
        "checkpoint as published, the zero-shot line).",
        "",
        "## Verdicts (paired bootstrap over seeds and sentence pairs, 95% interval)",
        "",
    ]
    for split in ("test", "dev"):
        section = summary["splits"][split]
        lines += [f"### {'STS Benchmark test' if split == 'test' else 'STS-B dev'}", "",
                  "| comparison | difference x100 | 95% interval | p (one-sided) | verdict |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for name, v in section["verdicts"].items():
            lines.append(_verdict_row(name, v))
        for name, v in section["against_zero_shot"].items():
            lines.append(_verdict_row(f"{name} - untrained checkpoint, same pooling", v))
        for name, v in section["against_checkpoint_mean"].items():
            lines.append(_verdict_row(f"{name} - untrained checkpoint, mean pooling", v))
        lines.append("")
    lines += [
        "## Spearman per layer (the layer-attention paper's Figure 1, on this model)",
        "",
        f"![Spearman per layer]({FIGURE})",
        "",
        "Lines: the untrained checkpoint's parameter-free poolings at each layer; dashed: mean "
        "pooling at each layer of each trained run's encoder (mean over seeds); "
        "markers at the last layer: each trained objective and pooling with its own trained "
        "pooler (mean ± sd over seeds).",
        "",
    ]
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = summary["layers"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.2), sharey=True)
    markers = {"cls": "s", "mean": "o", "layer-attention": "^"}
    for ax, split in zip(axes, ("dev", "test")):
        section = summary["splits"][split]
        for pooling, values in section["zero_shot_per_layer"].items():
            ax.plot(layers, [100 * v for v in values], marker=markers[pooling],
                    label=f"untrained {pooling}")  # fmt: skip
        for key, run in section["runs"].items():
            objective, pooling = key.split("/")
            ax.errorbar([layers[-1] + (0.15 if objective == "sup" else -0.15)],
                        [100 * run["mean"]], yerr=[100 * (run["sd"] or 0)], fmt=markers[pooling],
                        mfc="none" if objective == "unsup" else None, label=f"{key}")  # fmt: skip
            ax.plot(layers, [100 * v for v in run["encoder_per_layer_mean_pooling"]],
                    linestyle="--", alpha=0.6, label=f"{key}: its encoder, mean per layer")  # fmt: skip
        ax.set_title("STS-B dev" if split == "dev" else "STS Benchmark test")
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("Spearman x100 (cosine)")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def write_report(study: StsStudy, reports: Path, resamples: int = RESAMPLES) -> Path:
    """Write reports/sts/{README.md, results.json, spearman_per_layer.png}."""
    runs, zero = load_runs(study)
    summary = summarise(study, runs, zero, resamples)
    meta = {}
    for spec in study.objectives.values():
        path = study.layout.data(spec.task) / META
        if path.is_file():
            meta[spec.task] = json.loads(path.read_text(encoding="utf-8"))
    plot(summary, reports / FIGURE)
    atomic.write_text(reports / RESULTS, json.dumps(summary, indent=2) + "\n")
    atomic.write_text(reports / README, render_readme(study, summary, meta))
    return reports / README
