"""The one early-exit loop (``early_exit.core.run_exits``) and both engines over it give what the
policy applied to all-exit logits gives: every policy, a grid of thresholds, padded batches,
batch 1 and more.

The loop is checked first on a scripted pass whose logits are fixed in advance (both array
kinds, torch and NumPy); then the PyTorch runtime and the ONNX Runtime one on a tiny exported
model, each against its own engine's all-exit logits (the model's forward; the segments
chained with no sample leaving).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_export import SENTENCES, trained_folders

from aclpipe.data.tasks import TASKS
from aclpipe.early_exit.core import NUMPY_OPS, ArrayOps, run_exits
from aclpipe.early_exit.onnx_runtime import OnnxEarlyExit, open_session, read_export
from aclpipe.early_exit.policies import POLICIES, default_grid, exit_indices, window_size
from aclpipe.early_exit.runtime import TORCH_OPS, EarlyExitRuntime
from aclpipe.early_exit.tokens import encode, load_fast_tokenizer, pad
from aclpipe.exits.export import export_exits
from aclpipe.layout import EXPORT_TOKENIZER
from aclpipe.modeling.model import load_multi_exit

EXITS = [2, 3, 5, 6]  # 1-based layers
CLASSES = 3
OPS = {"numpy": (NUMPY_OPS, np.asarray), "torch": (TORCH_OPS, torch.as_tensor)}


def grid(num_labels: int, num_exits: int) -> list[tuple[str, float]]:
    return [(p, t) for p in POLICIES for t in default_grid(p, num_labels, num_exits, points=6)]


class ScriptedPass:
    """An engine pass whose logits at every exit are known in advance: ``logits(k)`` answers
    the rows still running. It checks what the loop hands back: only running rows, and a mask
    as wide as the longest of them."""

    def __init__(self, every_exit: np.ndarray, lengths: list[int], wrap) -> None:
        self.every_exit, self.lengths, self.wrap = every_exit, lengths, wrap  # [E, B, C]
        self.rows = list(range(len(lengths)))  # original positions of the running rows
        width = max(lengths, default=1)
        self.mask = wrap(np.array([[1] * n + [0] * (width - n) for n in lengths]))  # [B, T]
        self.ran: list[list[int]] = []  # per exit asked for, the rows it ran

    def logits(self, k: int):
        assert k == len(self.ran), "exits are asked for in order"
        self.ran.append(list(self.rows))
        return self.wrap(self.every_exit[k, self.rows])  # [b, C]

    def keep(self, stay, mask) -> None:
        self.rows = [r for r, s in zip(self.rows, stay.tolist()) if s]
        assert mask.shape[1] == max(self.lengths[r] for r in self.rows)
        assert mask.tolist() == self.mask[stay][:, : mask.shape[1]].tolist()
        self.mask = mask


def counting(ops: ArrayOps, calls: list[str]) -> ArrayOps:
    def wrap(name, fn):
        def counted(*args):
            calls.append(name)
            return fn(*args)

        return counted

    return ArrayOps(*(wrap(name, fn) for name, fn in zip(ArrayOps._fields, ops)))


@pytest.mark.parametrize("kind", sorted(OPS))
@pytest.mark.parametrize(("policy", "threshold"), grid(CLASSES, len(EXITS)))
def test_loop_equals_policy_on_all_exit_logits(kind: str, policy: str, threshold: float) -> None:
    ops, wrap = OPS[kind]
    rng = np.random.default_rng(0)
    every_exit = rng.normal(0.0, 1.5, (len(EXITS), 9, CLASSES)).astype(np.float32)
    every_exit[:, 4] = every_exit[0, 4]  # one sample whose argmax never changes (patience)
    lengths = [5, 12, 3, 9, 12, 7, 2, 10, 6]
    exits = wrap(np.array(EXITS, dtype=np.int64))
    expected = exit_indices(policy, threshold, every_exit)  # [B]
    picked = every_exit[expected, np.arange(len(lengths))]  # [B, C]
    run = ScriptedPass(every_exit, lengths, wrap)
    got = run_exits(run, ops, exits, policy, threshold, window_size(policy, threshold), False, 0.1)
    assert np.asarray(got.exit_index).tolist() == expected.tolist()
    assert np.asarray(got.exit_layer).tolist() == [EXITS[i] for i in expected]
    assert np.asarray(got.logits).tobytes() == picked.tobytes()  # the same floats, bit for bit
    for k, rows in enumerate(run.ran):  # no exit ran for a sample that had left
        assert rows == [i for i in range(len(lengths)) if expected[i] >= k]
    for i, n in enumerate(lengths):  # batch 1, no padding: one ops call, the exit index
        calls: list[str] = []
        one = ScriptedPass(every_exit[:, i : i + 1], [n], wrap)
        got = run_exits(one, counting(ops, calls), exits, policy, threshold,
                        window_size(policy, threshold), False, 0.1)  # fmt: skip
        assert np.asarray(got.exit_index).tolist() == [expected[i]]
        assert np.asarray(got.logits).tobytes() == picked[i : i + 1].tobytes()
        assert calls == ["full"] and len(one.ran) == expected[i] + 1


@pytest.mark.parametrize("kind", sorted(OPS))
@pytest.mark.parametrize(("policy", "threshold"), [*grid(CLASSES, len(EXITS))[::5], ("none", None)])
def test_an_empty_batch_gives_empty_arrays_of_the_engines_kind(kind, policy, threshold) -> None:
    ops, wrap = OPS[kind]
    every_exit = np.zeros((len(EXITS), 0, CLASSES), dtype=np.float32)
    run = ScriptedPass(every_exit, [], wrap)
    got = run_exits(run, ops, wrap(np.array(EXITS, dtype=np.int64)), policy, threshold,
                    window_size(policy, threshold), False, 0.1)  # fmt: skip
    assert tuple(got.logits.shape) == (0, CLASSES) and type(got.logits) is type(wrap(every_exit))
    assert tuple(got.exit_index.shape) == tuple(got.exit_layer.shape) == (0,)
    assert len(run.ran) == 1  # one exit asked for, no row run past it


@pytest.mark.parametrize("kind", sorted(OPS))
def test_loop_regression_and_no_exit(kind: str) -> None:
    """STS-B's patience (``abs(diff) < eps``) and ``none`` (every sample to the last exit)."""
    ops, wrap = OPS[kind]
    rng = np.random.default_rng(1)
    every_exit = rng.normal(0.0, 0.1, (len(EXITS), 6, 1)).astype(np.float32)  # [E, B, 1]
    lengths = [4, 8, 3, 8, 6, 5]
    exits = wrap(np.array(EXITS, dtype=np.int64))
    for t in (1, 2, 3):
        expected = exit_indices("patience", t, every_exit, regression=True, eps=0.1)
        run = ScriptedPass(every_exit, lengths, wrap)
        got = run_exits(run, ops, exits, "patience", t, t + 1, True, 0.1)
        assert np.asarray(got.exit_index).tolist() == expected.tolist()
    got = run_exits(ScriptedPass(every_exit, lengths, wrap), ops, exits, "none", None, 1, True, 0.1)
    assert np.asarray(got.exit_index).tolist() == [len(EXITS) - 1] * len(lengths)
    assert np.asarray(got.logits).tobytes() == every_exit[-1].tobytes()


# --- the two engines on a tiny exported model -------------------------------------------------


@pytest.fixture(scope="module", params=["mean", "layer-attention"])
def export_dir(request, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """An export whose heads are scaled so that every policy splits the batch."""
    root = tmp_path_factory.mktemp(f"core-{request.param}")
    model_dir, data_dir = trained_folders(root, tiny_model_dir, request.param)
    model = load_multi_exit(model_dir)
    with torch.no_grad():
        for head in model.heads:
            head.classifier.weight.mul_(40.0)
    model.save(model_dir)
    export_exits(TASKS["sst2"], model_dir, data_dir, root / "export", batch_size=4)
    return root / "export"


def onnx_every_exit(folder: Path, batch: dict[str, np.ndarray]) -> np.ndarray:
    """The segments chained by hand with every row to the end: the logits at each exit."""
    record = read_export(folder)
    embeddings = open_session(folder / record["embeddings"]["file"])
    names = [i.name for i in embeddings.get_inputs()]
    (states,) = embeddings.run(None, {name: batch[name] for name in names})
    every_exit = []
    for segment in record["segments"]:
        feed = {"states": states, "attention_mask": batch["attention_mask"]}
        states, logits = open_session(folder / segment["file"]).run(None, feed)
        every_exit.append(logits)
    return np.stack(every_exit)  # [E, B, C]


@pytest.mark.slow
def test_both_engines_equal_policy_on_all_exit_logits(export_dir: Path) -> None:
    model = load_multi_exit(export_dir / "model").eval()
    tokenizer = load_fast_tokenizer(export_dir / EXPORT_TOKENIZER, 32)
    pairs = list(zip(SENTENCES, SENTENCES[::-1]))
    batches = [pad(encode(tokenizer, [(s, None) for s in SENTENCES]), 0),
               pad(encode(tokenizer, pairs), 0)]  # fmt: skip
    batches += [pad(encode(tokenizer, [(s, None)]), 0) for s in SENTENCES[:4]]  # batch 1
    onnx_engine = OnnxEarlyExit(export_dir, "none", None)
    split = 0
    for batch in batches:
        tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
        with torch.no_grad():
            torch_every_exit = model(**tensors).logits.numpy()  # [E, B, C]
        every_exit = {"torch": torch_every_exit, "onnx": onnx_every_exit(export_dir, batch)}
        for policy, threshold in grid(2, model.num_exits):
            got = {
                "torch": EarlyExitRuntime(model, policy, threshold)(**tensors),
                "onnx": onnx_engine.with_setting(policy, threshold)(**batch),
            }
            for engine, result in got.items():
                expected = exit_indices(policy, threshold, every_exit[engine])
                index = np.asarray(result.exit_index)
                assert index.tolist() == expected.tolist(), (engine, policy, threshold)
                assert np.asarray(result.exit_layer).tolist() == [
                    model.spec.exits[i] for i in expected
                ]
                picked = every_exit[engine][expected, np.arange(len(expected))]
                np.testing.assert_allclose(np.asarray(result.logits), picked, atol=1e-5, rtol=0)
                split += len(set(expected.tolist())) > 1
    assert split >= 10  # the grid is informative: many settings split a batch


@pytest.mark.slow
def test_watched_batches_answer_as_unwatched_and_hand_over_the_full_model(
    export_dir: Path,
) -> None:
    """``serve --shadow``'s engine path on the real export: ``answer_watched`` gives
    ``answer``'s outputs, and each picked row's logits, seen plus resumed from its states,
    are the segments chained by hand with every row to the end (at every exit)."""
    from aclpipe.early_exit.predict import Predictor
    from aclpipe.early_exit.scheduler import PredictorAdapter

    tokenizer = load_fast_tokenizer(export_dir / EXPORT_TOKENIZER, 32)
    rows = encode(tokenizer, [(s, None) for s in SENTENCES])
    every_exit = np.concatenate([onnx_every_exit(export_dir, pad([row], 0)) for row in rows], 1)
    rng = np.random.default_rng(0)
    resumed = 0
    for policy, threshold in grid(2, 4)[::3]:
        adapter = PredictorAdapter(Predictor(export_dir, policy, threshold, "onnx", batch_size=8))
        picks = [bool(rng.random() < 0.7) for _ in rows]
        outputs, handoffs = adapter.answer_watched(rows, picks)
        plain = adapter.answer(rows)
        assert [o[2] for o in outputs] == [o[2] for o in plain]  # the same exits
        np.testing.assert_allclose([o[0] for o in outputs], [o[0] for o in plain], atol=1e-5)
        assert len(handoffs) == sum(picks)
        for handoff, j in zip(handoffs, [j for j, p in enumerate(picks) if p]):
            layer = outputs[j][2]
            assert adapter.exits[handoff.exit] == layer
            whole = handoff.seen if handoff.rest is None else np.concatenate(
                [handoff.seen, handoff.rest()])  # fmt: skip
            resumed += handoff.rest is not None
            np.testing.assert_allclose(whole, every_exit[:, j], atol=1e-4, rtol=0)
    assert resumed >= 5  # rows left early and were resumed from their states
