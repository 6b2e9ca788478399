"""benchmarks/drift_live.py: its window arithmetic against a plain loop, and the live harness
end to end (three real ``aclpipe serve`` processes on 127.0.0.1, the tiny exported model, a
few hundred records, short windows) against in-process ``predict``."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from test_drift_benchmark import glue  # noqa: F401  (the tiny GLUE fixture)
from test_export import trained_folders

from aclpipe.data.tasks import TASKS
from aclpipe.early_exit.predict import Predictor
from aclpipe.exits.export import export_exits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import drift_live  # noqa: E402  (benchmarks/drift_live.py)


def plain_windows(stream, answers, samples, last, window, budget):
    """The same figures, one record at a time."""
    cpu_at = {s["record"]: s["cpu"] for s in samples}
    rows = []
    for w in range(len(stream) // window):
        span = list(range(w * window, (w + 1) * window))
        row = {}
        for name in answers:
            ok = [i for i in span if answers[name][i][0] is not None]
            agree = 0
            for i in span:
                if answers[name][i][0] is not None and answers[name][i][0] == answers["full"][i][0]:
                    agree += 1
            total = 0
            for i in ok:
                total += answers[name][i][1]
            used = cpu_at[span[-1] + 1][name] - cpu_at[span[0]][name]
            full = cpu_at[span[-1] + 1]["full"] - cpu_at[span[0]]["full"]
            row[name] = {"agreement": agree / window, "layer_speedup": last / (total / len(ok)),
                         "errors": window - len(ok), "cpu_speedup": full / used}  # fmt: skip
            if all(stream[i]["gold"] is not None for i in span):
                right = 0
                for i in span:
                    right += answers[name][i][0] == stream[i]["gold"]
                row[name]["accuracy"] = right / window
        rows.append(row)
    return rows


def test_live_windows_against_a_plain_loop() -> None:
    rng = random.Random(0)
    n, window, last = 60, 20, 6
    stream = [{"phase": "a" if i < 40 else "b", "gold": rng.randrange(2) if i < 40 else None}
              for i in range(n)]  # fmt: skip
    answers = {}
    for name in drift_live.SERVERS:
        given = []
        for _ in range(n):
            if name != "full" and rng.random() < 0.1:  # an error: no answer
                given.append((None, None, None, "TimeoutError"))
            else:
                layer = last if name == "full" else rng.choice((2, 4, 6))
                given.append((rng.randrange(2), layer, rng.random() / 10, None))
        answers[name] = given
    samples, spent = [], {name: 0.0 for name in drift_live.SERVERS}
    served = shadow = 0.0
    for i in range(0, n + 1, 5):
        for name in spent:
            spent[name] += rng.uniform(0.5, 1.5)
        served, shadow = served + rng.uniform(0.5, 1.0), shadow + rng.uniform(0, 0.1)
        info = {"served_seconds": served, "shadow_seconds": shadow, "drawn": i, "observed": i,
                "threshold": 0.7 + i / 1000}  # fmt: skip
        samples.append({"record": i, "cpu": dict(spent), "shadow": info})
    rows = drift_live.live_windows(stream, answers, samples, last, window, budget=1.0)
    want = plain_windows(stream, answers, samples, last, window, 1.0)
    assert len(rows) == len(want) == 3
    at = {s["record"]: s["shadow"] for s in samples}
    for w, (row, plain) in enumerate(zip(rows, want)):
        assert row["start"] == w * window and row["phase"] == stream[w * window]["phase"]
        for name in drift_live.SERVERS:
            for key, value in plain[name].items():
                assert row[name][key] == pytest.approx(value), (w, name, key)
            assert ("accuracy" in row[name]) == (w < 2)
        for name in ("fixed", "recalibrated"):
            if w < 2:
                floor = row["full"]["accuracy"] - 0.01
                assert row[name]["within_budget"] == (row[name]["accuracy"] >= floor - 1e-12)
            else:
                assert "within_budget" not in row[name]
        begin, end = at[w * window], at[(w + 1) * window]
        used, extra = (end[k] - begin[k] for k in ("served_seconds", "shadow_seconds"))
        recal = row["recalibrated"]
        assert recal["layer_speedup_with_shadow"] == pytest.approx(
            recal["layer_speedup"] * used / (used + extra)
        )
        assert row["threshold_at_end"] == end["threshold"]


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("drift-live")
    model_dir, data_dir = trained_folders(root, tiny_model_dir, "mean")
    export_exits(TASKS["sst2"], model_dir, data_dir, root / "export", batch_size=4)
    return root / "export"


@pytest.mark.slow
def test_live_harness_on_the_tiny_model(tiny_export: Path, glue: Path, tmp_path: Path) -> None:  # noqa: F811
    """50 records a phase (350 in all) at 150 records/s through the three servers; confidence 0.5
    sends every early answer from the first exit, so the fixed server is exit 0 of predict."""
    out_json, figure = tmp_path / "live.json", tmp_path / "live.png"
    out = drift_live.main([
        "--export", str(tiny_export), "--glue-dir", str(glue), "--policy", "confidence",
        "--threshold", "0.5", "--phase-records", "50", "--window", "50", "--rate", "150",
        "--fraction", "1.0", "--share", "10", "--timeout", "20",
        "--out", str(out_json), "--figure", str(figure),
    ])  # fmt: skip
    assert json.loads(out_json.read_text()) == json.loads(json.dumps(out))
    assert figure.stat().st_size > 0
    assert out["exit_codes_after_sigterm"] == {name: 0 for name in drift_live.SERVERS}
    assert all(not out["latency"][name]["errors"] for name in drift_live.SERVERS)
    stream = drift_live.build_stream(glue, [(p, 50) for p, _ in drift_live.PHASES], 0)
    lines = [json.dumps({"text": r["text"]}) for r in stream]
    full = [
        r["label"] for r in Predictor(tiny_export, "none", None, "onnx", 1).records(lines, "jsonl")
    ]
    first = Predictor(tiny_export, "confidence", 0.5, "onnx", 1)
    early = list(first.records(lines, "jsonl"))
    assert {r["exit_layer"] for r in early} == {first.exits[0]}
    rows = out["windows"]
    assert len(rows) == len(drift_live.PHASES)
    for w, row in enumerate(rows):
        span = range(50 * w, 50 * w + 50)
        assert row["full"]["agreement"] == 1.0 and row["full"]["layer_speedup"] == 1.0
        assert row["fixed"]["layer_speedup"] == pytest.approx(first.exits[-1] / first.exits[0])
        agree = sum(early[i]["label"] == full[i] for i in span) / 50
        assert row["fixed"]["agreement"] == pytest.approx(agree, abs=1 / 50)  # a near tie may flip
        if "accuracy" in row["full"]:
            right = sum(full[i] == stream[i]["gold"] for i in span) / 50
            assert row["full"]["accuracy"] == pytest.approx(right, abs=1 / 50)
    cost = out["shadow_cost"]
    assert cost["drawn"] == 50 + len(stream)  # F = 1: every record drawn, 50 warm-up ones too
    assert cost["observed"] + cost["refused"] + cost["dropped"] == cost["drawn"]
    # The controller may move during the warm-up, before the first sample: its log starts at
    # the threshold it was given, each move starts where the last one ended, never looser.
    events, thresholds = out["events"], [t for _, t in out["threshold_samples"]]
    assert all(e["event"] == "recalibrate" and e["new"] >= 0.5 for e in events)
    assert [e["old"] for e in events] == [0.5] + [e["new"] for e in events[:-1]]
    assert set(thresholds) <= {0.5} | {e["new"] for e in events}
    assert all(t >= 0.5 for t in thresholds)
