"""benchmarks/serve_ceiling.py: it drives the server's engine path (one batch of each k arrivals
in turn, cut by ``length_groups``), checked call by call against a plain reference, and its
outputs are predict's on sorted batches."""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

import pytest
from test_export import SENTENCES, trained_folders

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import serve_ceiling  # noqa: E402  (benchmarks/serve_ceiling.py)

from aclpipe.early_exit.predict import Predictor  # noqa: E402
from aclpipe.early_exit.scheduler import PredictorAdapter, length_groups  # noqa: E402
from aclpipe.early_exit.tokens import encode  # noqa: E402


class Recorder:
    """A predictor that records each engine call's rows and answers each row with its id."""

    exits = [1, 2, 3]

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def run_rows(self, rows: list[dict]) -> list[tuple]:
        self.calls.append([row["id"] for row in rows])
        return [([float(row["id"])], [1.0], 1) for row in rows]


def reference_calls(lengths: list[int], k: int) -> list[list[int]]:
    """The slow way: walk the arrivals, close a batch every k, cut it as the server does."""
    calls, batch = [], []
    for i in range(len(lengths)):
        batch.append(i)
        if len(batch) == k or i == len(lengths) - 1:
            groups = length_groups([lengths[j] for j in batch])
            calls.extend([batch[g] for g in group] for group in groups)
            batch = []
    return calls


@pytest.mark.parametrize("n", [1, 2, 7, 31, 32, 33, 100])
@pytest.mark.parametrize("k", [1, 2, 3, 8, 16, 32])
def test_engine_calls_against_a_plain_reference(n: int, k: int) -> None:
    lengths = [random.Random(n * 100 + k).randint(3, 60) for _ in range(n)]
    arrivals = [{"id": i, "input_ids": [0] * length} for i, length in enumerate(lengths)]
    recorder = Recorder()
    outputs = serve_ceiling.run_arrivals(PredictorAdapter(recorder), arrivals, k)
    assert recorder.calls == reference_calls(lengths, k)
    assert [o[0] for o in outputs] == [[float(i)] for i in range(n)]  # arrival order
    for call in recorder.calls:  # a call never mixes two batches of arrivals
        assert len({i // k for i in call}) == 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return trained_folders(tmp_path_factory.mktemp("ceiling"), tiny_model_dir, "mean")[0]


@pytest.mark.parametrize(("policy", "threshold"), [("entropy", 0.6925), ("patience", 1)])
@pytest.mark.parametrize("k", [1, 3, 8, 32])
def test_arrivals_answer_as_sorted_batches(
    model_dir: Path, policy: str, threshold: float, k: int
) -> None:
    predictor = Predictor(model_dir, policy, threshold, batch_size=32)
    sentences = [f"{a} {b}" for a in SENTENCES for b in SENTENCES[:4]]  # 32, 2 to 30 words
    arrivals = encode(predictor.tokenizer, [(s, None) for s in sentences])
    random.Random(k).shuffle(arrivals)
    got = serve_ceiling.run_arrivals(PredictorAdapter(predictor), arrivals, k)
    want = predictor.run_rows(arrivals)  # sorted by length, batches of 32
    assert len({layer for _, _, layer in want}) > 1  # the policy exits at more than one layer
    for (logits, probs, layer), (logits_0, probs_0, layer_0) in zip(got, want, strict=True):
        assert layer == layer_0
        assert logits == pytest.approx(logits_0, abs=1e-5)
        assert probs == pytest.approx(probs_0, abs=1e-5)


def test_medians_per_arrival_size() -> None:
    ones, eights = [0.6, 0.7, 0.65, 0.9], [0.8, 0.75, 0.9, 0.5]
    rounds = [
        {"ratio_arrivals_1": a, "ratio_arrivals_8": b} for a, b in zip(ones, eights, strict=True)
    ]
    assert serve_ceiling.medians(rounds, [1, 8]) == {
        "median_ratio_arrivals_1": statistics.median(ones),
        "median_ratio_arrivals_8": statistics.median(eights),
    }
