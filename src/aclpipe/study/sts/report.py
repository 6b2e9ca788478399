"""The STS study's report: reports/sts/README.md, results.json and the per-layer figure,
generated from sts/runs/ (``aclpipe sts report``); the README's words are ``markdown``.

Claim L2 (docs/claims.md), per objective: "layer-attention beats mean" and
"layer-attention beats cls", superiority claims (the paper says the pooling *improves on* the
baseline). Each is judged as the seeds campaign judges its claims (``study.verdicts``): the
paired bootstrap of ``paired.bootstrap_differences`` (the seeds both runs have and the
sentence pairs resampled together, sts.verdicts.resamples times), the mean over seeds of
``Spearman(A_s) - Spearman(B_s)`` with its 95% interval, and ``verdicts.judge``: better /
worse / comparable (no worse than the baseline by sts.verdicts.margin) / inconclusive, with
the verdict's own one-sided p and its Monte Carlo error. The STS Benchmark test is the primary
split: its claims are one family (Holm, ``verdicts.family``); STS-B dev is shown beside them,
outside the family.

The untrained checkpoint is context, not a claim: each trained run against the checkpoint's
same (parameter-free) pooling, and against its mean pooling, the one it was published with;
the same verdicts, no family. The checkpoint is one fixed run: against it, a trained pooling
is compared on the same resamples with the checkpoint's own value in each.

A resample of sentence pairs is a count vector; the Spearman correlation of the resampled
pairs is computed from the counts (:func:`weighted_spearman`: average ranks of the replicated
sample, then the count-weighted Pearson correlation of the ranks), so it equals
``scipy.stats.spearmanr`` of the pairs repeated as drawn.
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
from aclpipe.study.stats import paired, verdicts
from aclpipe.study.stats.verdicts import SUPERIORITY, Rules
from aclpipe.study.sts.embeddings import POOLINGS
from aclpipe.study.sts.study import COSINES, RUN_RECORD, StsStudy

README = REPORTS_README
RESULTS = RESULTS_JSON
FIGURE = "spearman_per_layer.png"
PRIMARY, SECONDARY = "test", "dev"  # the family is judged on test; dev is shown beside it
SPLITS = (PRIMARY, SECONDARY)
CLAIMS = (("layer-attention", "mean"), ("layer-attention", "cls"))  # L2, per objective
CHECKPOINT = "checkpoint"  # the untrained checkpoint's runs are named checkpoint/<pooling>
PUBLISHED = "mean"  # all-MiniLM-L6-v2's own pooling: the strong zero-shot baseline
NOT_RUN = "not run yet"
NO_COMMON_SEED = "no common seed"


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


def _centred(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ranks [R, N], their weighted sum of squares [R])``: ``values``' average ranks in each
    resample ``weights [R, N]`` (float), minus their weighted mean."""
    ranks = weighted_ranks(values, weights)
    total = weights.sum(axis=1, keepdims=True)
    ranks = ranks - (weights * ranks).sum(axis=1, keepdims=True) / total
    return ranks, (weights * ranks * ranks).sum(axis=1)


def _correlation(a: tuple, b: tuple, weights: np.ndarray) -> np.ndarray:
    covariance = (weights * a[0] * b[0]).sum(axis=1)
    scale = np.sqrt(a[1] * b[1])
    return np.where(scale > 0, covariance / np.maximum(scale, 1e-300), 0.0)


def weighted_spearman(values: np.ndarray, gold: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Spearman correlation of ``values`` with ``gold`` in each resample ``weights [R, N]``
    (0 where either side is constant, as ``metrics``): ``[R]``."""
    weights = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    return _correlation(_centred(values, weights), _centred(gold, weights), weights)


class SpearmanCache:
    """Each run's Spearman under one draw of weights, computed once per split: the claims and
    the context reuse the same runs under the same (cached) ``paired.draw``, the checkpoint
    stands in for every seed, and at 10,000 resamples one Spearman of 1,500 pairs takes about
    a second. Keyed by the arrays' identity; each entry holds its arrays, so no id is reused."""

    def __init__(self) -> None:
        self._values: dict[tuple[int, int, int], tuple] = {}
        self._draw: tuple | None = None  # (weights, gold, float weights, gold's _centred)

    def spearman(self, values: np.ndarray, gold: np.ndarray, weights: np.ndarray) -> np.ndarray:
        key = (id(values), id(gold), id(weights))
        if key not in self._values:
            d = self._draw
            if d is None or d[0] is not weights or d[1] is not gold:
                floats = np.atleast_2d(np.asarray(weights, dtype=np.float64))
                d = self._draw = (weights, gold, floats, _centred(gold, floats))
            result = _correlation(_centred(values, d[2]), d[3], d[2])
            self._values[key] = (values, gold, weights, result)
        return self._values[key][-1]


@dataclass
class SpearmanMeasure:
    """One run's Spearman on a split under bootstrap weights (``paired``'s Measure API)."""

    cosines: np.ndarray  # [N]
    cache: SpearmanCache | None = None
    cost_range: tuple[float, float] = (0.0, 1.0)

    def values(self, task, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
        if self.cache is None:
            return weighted_spearman(self.cosines, labels, weights)
        return self.cache.spearman(self.cosines, labels, weights)


def spearman(cosines: np.ndarray, gold: np.ndarray) -> float:
    """Spearman of one run's cosines with the gold scores, every pair once."""
    return float(weighted_spearman(cosines, gold, np.ones(len(gold)))[0])


def load_runs(study: StsStudy) -> tuple[dict, dict]:
    """``(runs, zero_shot)``: ``runs[(objective, pooling)][seed] = (record, cosines)``. Every
    run must have scored the checkpoint's pairs, in its order."""
    zero_dir = study.zero_shot_dir()
    if not (zero_dir / COSINES).is_file():
        raise UserError(f"{zero_dir} not found: run `aclpipe sts zero-shot` first")
    zero = {
        "record": json.loads((zero_dir / RUN_RECORD).read_text(encoding="utf-8")),
        "cosines": dict(np.load(zero_dir / COSINES)),
    }
    runs: dict = {}
    scored = {split: [(str(zero_dir), zero["cosines"][f"gold_{split}"], None)] for split in SPLITS}
    for objective in study.objectives:
        for pooling in study.poolings:
            for seed in study.seeds:
                folder = study.run_dir(objective, pooling, seed)
                if (folder / COSINES).is_file():
                    record = json.loads((folder / RUN_RECORD).read_text(encoding="utf-8"))
                    cosines = dict(np.load(folder / COSINES))
                    runs.setdefault((objective, pooling), {})[seed] = (record, cosines)
                    for split in SPLITS:
                        scored[split].append((str(folder), cosines[f"gold_{split}"], None))
    for split, found in scored.items():
        paired.check_same_examples(found, split, "score both with the same STS pair files")
    return runs, zero


def judged(a: dict, b: dict, gold: np.ndarray, rules: Rules) -> dict:
    """The claim "A beats B" over the seeds both have (``{seed: SpearmanMeasure}``): the means, the
    difference with its 95% interval, the detectable size and ``verdicts.judge``'s verdict."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return {"seeds": [], "verdict": NO_COMMON_SEED}
    task = get_task("stsb")
    difference, diffs = paired.bootstrap_differences(task, a, b, gold, rules.resamples)
    low, high = paired.percentile_interval(diffs, paired.LEVEL)
    return {
        "seeds": seeds,
        "a_mean": float(np.mean([spearman(a[s].cosines, gold) for s in seeds])),
        "b_mean": float(np.mean([spearman(b[s].cosines, gold) for s in seeds])),
        "difference": difference,
        "low": low,
        "high": high,
        "detectable": verdicts.detectable(low, high),
        "resamples": rules.resamples,
        **verdicts.judge(diffs, SUPERIORITY, rules),
    }


def _claims(study: StsStudy, measures: dict, gold: np.ndarray, rules: Rules) -> list[dict]:
    """L2's claims of the study's objectives and poolings, judged where both runs exist."""
    out = []
    for objective in study.objectives:
        for a, b in CLAIMS:
            if a not in study.poolings or b not in study.poolings:
                continue  # not in this study's design
            claim = {
                "claim": f"{objective}: {a} beats {b}",
                "objective": objective,
                "a": f"{objective}/{a}",
                "b": f"{objective}/{b}",
                "kind": SUPERIORITY,
            }
            missing = [f"{objective}/{p}" for p in (a, b) if (objective, p) not in measures]
            if missing:
                claim.update(seeds=[], verdict=NOT_RUN, missing=missing)
            else:
                claim.update(
                    judged(measures[(objective, a)], measures[(objective, b)], gold, rules)
                )
            out.append(claim)
    return out


def _context(measures: dict, checkpoint: dict, gold: np.ndarray, rules: Rules) -> list[dict]:
    """Each trained run against the checkpoint's same pooling and its published mean pooling
    (once for a mean run, where the two are one)."""
    out = []
    for (objective, pooling), per_seed in measures.items():
        for against in dict.fromkeys((pooling, PUBLISHED)):
            fixed = {s: checkpoint[against] for s in per_seed}
            out.append({
                "a": f"{objective}/{pooling}",
                "b": f"{CHECKPOINT}/{against}",
                "same_pooling": against == pooling,
                "published": against == PUBLISHED,
                **judged(per_seed, fixed, gold, rules),
            })  # fmt: skip
    return out


def summarise(study: StsStudy, runs: dict, zero: dict, rules: Rules | None = None) -> dict:
    """Every number the README shows (results.json); ``rules`` default to sts.verdicts."""
    rules = rules or study.verdicts
    num_layers = zero["cosines"]["layers_dev"].shape[1]
    missing = {
        f"{o}/{p}": [s for s in study.seeds if s not in runs.get((o, p), {})]
        for o in study.objectives
        for p in study.poolings
    }
    out: dict = {
        "model": zero["record"]["model"],
        "layers": list(range(1, num_layers + 1)),
        "runs_present": sum(len(seeds) for seeds in runs.values()),
        "runs_planned": len(study.objectives) * len(study.poolings) * len(study.seeds),
        "seeds_planned": list(study.seeds),
        "missing": {key: seeds for key, seeds in missing.items() if seeds},
        "rules": {"margin": rules.margin, "resamples": rules.resamples, "alpha": rules.alpha},
        "primary": PRIMARY,
        "secondary": SECONDARY,
        "published": PUBLISHED,
        "splits": {},
    }
    for split in SPLITS:
        cache = SpearmanCache()
        gold = zero["cosines"][f"gold_{split}"]
        zero_layers = zero["cosines"][f"layers_{split}"]  # [P, L, N]
        section: dict = {
            "pairs": len(gold),
            "zero_shot_per_layer": {
                p: [spearman(c, gold) for c in zero_layers[i]] for i, p in enumerate(POOLINGS)
            },
            "zero_shot": {p: spearman(zero_layers[i, -1], gold) for i, p in enumerate(POOLINGS)},
            "runs": {},
        }
        measures = {}
        for (objective, pooling), seeds in runs.items():
            per_seed = {
                s: SpearmanMeasure(c[f"trained_{split}"], cache) for s, (_, c) in seeds.items()
            }
            measures[(objective, pooling)] = per_seed
            values = [spearman(m.cosines, gold) for m in per_seed.values()]
            mean_index = POOLINGS.index("mean")
            per_layer = [  # per seed: mean pooling at each layer of the trained encoder
                [spearman(c, gold) for c in cosines[f"layers_{split}"][mean_index]]
                for _, cosines in seeds.values()
            ]
            section["runs"][f"{objective}/{pooling}"] = {
                "seeds": sorted(seeds),
                "spearman": values,
                "mean": float(np.mean(values)),
                "sd": float(np.std(values, ddof=1)) if len(values) > 1 else None,
                "train_seconds": [r["train_seconds"] for r, _ in seeds.values()],
                "encoder_per_layer_mean_pooling": np.mean(per_layer, axis=0).tolist(),
            }
        checkpoint = {p: SpearmanMeasure(zero_layers[i, -1], cache) for i, p in enumerate(POOLINGS)}
        section["claims"] = _claims(study, measures, gold, rules)
        section["context"] = _context(measures, checkpoint, gold, rules)
        out["splits"][split] = section
    # The family: L2's claims judged on the primary split, each with its verdict's own p.
    tested = [c for c in out["splits"][PRIMARY]["claims"] if c["verdict"] in verdicts.VERDICTS]
    verdicts.family(tested, rules, rules.resamples)
    out["family"] = len(tested)
    return out


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


def write_report(study: StsStudy, reports: Path, rules: Rules | None = None) -> Path:
    """Write reports/sts/{README.md, results.json, spearman_per_layer.png}; ``rules`` default
    to sts.verdicts."""
    from aclpipe.study.sts.markdown import render_readme

    runs, zero = load_runs(study)
    summary = summarise(study, runs, zero, rules)
    meta = {}
    for spec in study.objectives.values():
        path = study.layout.data(spec.task) / META
        if path.is_file():
            meta[spec.task] = json.loads(path.read_text(encoding="utf-8"))
    plot(summary, reports / FIGURE)
    atomic.write_text(reports / RESULTS, json.dumps(summary, indent=2) + "\n")
    atomic.write_text(reports / README, render_readme(study, summary, meta, FIGURE))
    return reports / README
