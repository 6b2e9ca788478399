"""When a number means nothing: the majority-class floor and the timing rule.

Pure functions over recorded scores and timings (no torch, no scikit-learn), shared by the
evaluate stage and the trade-off report, so both say the same thing in the same words.

**Majority-class floor** (docs/methods.md, Comparisons). The score of a constant prediction (the
most frequent train label; for STS-B the train mean, whose correlations are undefined and
scored 0), computed by ``scoring.majority_scores``. A model, an exit or a budget floor at or
below it has learned nothing a constant guess would not, and a speed-up measured against it
is not a result.

**Timing rule.** A measured speed-up at batch size ``b`` is trusted only when it was timed on
at least ``MIN_TIMED_EXAMPLES_BATCH1`` examples at batch 1 and at least
``MIN_TIMED_BATCHES`` full batches otherwise (64 examples at batch 32): below that, one slow
or fast call decides the median. A measured speed-up above the layer speed-up of the timed
examples (what skipping layers can buy at most: the runtime also runs the shallow heads) by
more than ``NOISE_MARGIN`` is timing noise and is marked ``*``. The bound holds for each
engine's early exit over that engine's full model (``BOUNDED_SPEEDUPS``: PyTorch's, ONNX
Runtime's); ONNX Runtime's early exit over the full PyTorch model also gains from the engine,
so no layer bound applies to it and it is never marked.
"""

from __future__ import annotations

from collections.abc import Iterable

# Scores are equal to the floor when they differ by float rounding only.
_TOLERANCE = 1e-9
MIN_TIMED_EXAMPLES_BATCH1 = 32
MIN_TIMED_BATCHES = 2
NOISE_MARGIN = 0.05
NOISE_MARK = "*"
# the measured speed-ups a layer bound applies to (key prefix in curves.json, label in a line)
BOUNDED_SPEEDUPS = (("measured_speedup", ""), ("onnx_speedup", " (onnx)"))
ENGINES_NOTE = (
    "torch: the full PyTorch model's time over the PyTorch early-exit runtime's; onnx: the same "
    "on ONNX Runtime (its full model: every segment, no early exit); onnx/torch-full: the full "
    "PyTorch model's time over the ONNX Runtime early-exit runtime's (no layer bound)"
)
NOISE_FOOTNOTE = (
    f"{NOISE_MARK} measured above the layer speed-up of the timed examples by more than "
    f"{100 * NOISE_MARGIN:.0f}%: timing noise, not a speed-up"
)


def at_or_below(score: float | None, floor: float | None) -> bool:
    """Whether ``score`` is at or below ``floor`` (False when either is unknown)."""
    return score is not None and floor is not None and score <= floor + _TOLERANCE


def min_timed_examples(batch_size: int) -> int:
    """The fewest timed examples whose measured speed-up at ``batch_size`` is trusted."""
    return MIN_TIMED_EXAMPLES_BATCH1 if batch_size == 1 else MIN_TIMED_BATCHES * batch_size


def too_few_timed(examples: int | None, batch_sizes: Iterable[int] = (1, 32)) -> list[int]:
    """The batch sizes whose timing used too few examples (none when nothing was timed)."""
    if not examples:
        return []
    return [b for b in batch_sizes if examples < min_timed_examples(b)]


def timing_note(examples: int | None, repeats: int | None = None) -> str:
    """``timed on N dev examples (median of R repeats)``, and whether that is too few."""
    if not examples:
        return "not timed"
    note = f"timed on {examples} dev examples"
    if repeats:
        note += f" (median of {repeats} repeats)"
    few = too_few_timed(examples)
    if few:
        needs = ", ".join(f"batch {b} needs {min_timed_examples(b)}" for b in few)
        note += f": too few to trust ({needs})"
    return note


def is_noise(measured: float | None, bound: float | None) -> bool:
    """Whether a measured speed-up exceeds its layer speed-up bound by more than the margin."""
    return measured is not None and bound is not None and measured > bound * (1 + NOISE_MARGIN)


def speedup_bound(point: dict) -> float | None:
    """The layer speed-up of the timed examples, or of the whole split in older curves."""
    return point.get("timed_layer_speedup", point.get("layer_speedup"))


def final_warning(
    name: str, score: float, majority: float, what: str = "final exit", speedups: str = "the"
) -> str:
    """``speedups``: "the" (evaluate: the sweep table follows) or "its" (tradeoff)."""
    follow = " below" if speedups == "the" else ""
    return (
        f"warning: {name} {what} {100 * score:.2f} is at or below the majority-class score "
        f"{100 * majority:.2f}: the model has not learned the task; {speedups} speed-ups"
        f"{follow} mean nothing"
    )


def exits_warning(name: str, layers: list[int], majority: float) -> str:
    listed = ", ".join(f"L{k}" for k in layers)
    return (
        f"warning: {name} exit{'s' if len(layers) > 1 else ''} {listed} score at or below the "
        f"majority-class score {100 * majority:.2f}: a sample that leaves there gets no better "
        "than a constant guess"
    )


def budget_warning(task: str, budget: str, floor: float, majority: float) -> str:
    return (
        f"warning: {task} budget '{budget}' admits scores down to {100 * floor:.2f}, at or "
        f"below the majority-class score {100 * majority:.2f}: a constant guess meets it, so "
        "it admits exiting everything at layer 1"
    )


def noise_warning(name: str, flagged: list[tuple[str, int, float, float]], timed: str) -> str:
    """``flagged``: (setting, batch size, measured, bound) of each marked speed-up."""
    setting, size, measured, bound = max(flagged, key=lambda f: f[2] / f[3])
    return (
        f"warning: {name}: {len(flagged)} measured speed-up{'s' if len(flagged) > 1 else ''} "
        f"above the layer speed-up bound by more than {100 * NOISE_MARGIN:.0f}% (largest "
        f"{measured:.2f}x against {bound:.2f}x, {setting} at batch {size}; {timed}): timing "
        f"noise, marked {NOISE_MARK}"
    )


def few_timed_warning(name: str, examples: int) -> str:
    return f"warning: {name} speed-ups {timing_note(examples)}; raise evaluate.timing_examples"
