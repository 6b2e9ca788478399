"""The majority-class line on the report figures (tradeoff_plots._majority_line): drawn where
it fits beside the data, named on the axis where it lies far below every score."""

import pytest

from aclpipe.stages.tradeoff_plots import MAJORITY_SQUEEZE, _figure, _majority_line


def _axes(*spans, share=False):
    """One axis per (low, high) score span (x100), drawn as a band, a line and a point."""
    fig = _figure(6, 3)
    axes = []
    for i, (low, high) in enumerate(spans, start=1):
        ax = fig.add_subplot(1, len(spans), i, sharey=axes[0] if share and axes else None)
        if low is not None:
            ax.fill_between([1, 2], [low, low + 1], [high - 1, high], alpha=0.2)
            ax.plot([1, 2], [low + 1, high - 1])
            ax.scatter([1.5], [(low + high) / 2])
        axes.append(ax)
    return axes


def _majority_drawn(ax, value):
    return [line for line in ax.get_lines() if list(line.get_ydata()) == [value, value]]


def _notes(ax):
    return [t.get_text() for t in ax.texts]


def test_majority_far_below_the_data_is_named_not_drawn():
    (ax,) = _axes((78.0, 91.0))  # SST-2: every score 78-91, majority 50.92
    _majority_line(ax, 0.5092)
    assert not _majority_drawn(ax, 50.92)
    assert _notes(ax) == ["majority class 50.92: below this axis"]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["majority class (50.92), below the axis"]
    assert ax.get_ylim()[0] > 75  # the axis keeps to the data


def test_majority_near_the_data_is_drawn():
    (ax,) = _axes((75.5, 84.0))  # MRPC: majority 74.8 just below the lowest score
    _majority_line(ax, 0.748)
    assert len(_majority_drawn(ax, pytest.approx(74.8))) == 1
    assert ax.get_legend_handles_labels()[1] == ["majority class (74.80)"]
    assert not ax.texts
    assert ax.get_ylim()[0] < 74.8


@pytest.mark.parametrize("majority", [0.527, 0.58, 0.95])  # inside the scores, above them
def test_majority_at_or_above_the_lowest_score_is_always_drawn(majority):
    (ax,) = _axes((49.0, 58.0))
    _majority_line(ax, majority)
    assert len(_majority_drawn(ax, pytest.approx(100 * majority))) == 1
    assert not ax.texts


def test_the_squeeze_threshold_by_hand():
    # Scores 80-90: drawn at 70, where the data fill 10 / 20 = MAJORITY_SQUEEZE of the axis;
    # named just below it.
    assert MAJORITY_SQUEEZE == 0.5
    (at,) = _axes((80.0, 90.0))
    _majority_line(at, 0.70)
    assert len(_majority_drawn(at, pytest.approx(70.0))) == 1
    (below,) = _axes((80.0, 90.0))
    _majority_line(below, 0.699)
    assert not _majority_drawn(below, pytest.approx(69.9))
    assert _notes(below) == ["majority class 69.90: below this axis"]


def test_axes_sharing_y_decide_together():
    # Alone, the 80-90 panel would name the line; its neighbour's 45-60 scores share the
    # axis, so both panels draw it. An empty neighbour changes nothing.
    left, right = _axes((80.0, 90.0), (45.0, 60.0), share=True)
    for ax in (left, right):
        _majority_line(ax, 0.509)
        assert len(_majority_drawn(ax, pytest.approx(50.9))) == 1
    lone, empty = _axes((80.0, 90.0), (None, None), share=True)
    for ax in (lone, empty):
        _majority_line(ax, 0.509)
        assert not _majority_drawn(ax, pytest.approx(50.9))


def test_no_majority_no_line_and_an_empty_axis_draws_it():
    (ax,) = _axes((80.0, 90.0))
    _majority_line(ax, None)
    assert not ax.get_lines()[1:] and not ax.texts
    (empty,) = _axes((None, None))
    _majority_line(empty, 0.5)
    assert len(_majority_drawn(empty, pytest.approx(50.0))) == 1
