"""The batched early-exit runtime decides exactly as the policy applied to all-exit logits."""

from __future__ import annotations

import pytest
import torch

from aclpipe.early_exit.policies import exit_indices
from aclpipe.early_exit.runtime import EarlyExitRuntime, full_forward
from aclpipe.modeling.backbone import load_encoder
from aclpipe.modeling.model import ExitSpec, MultiExitModel

SETTINGS = [("entropy", 0.0), ("entropy", 0.2), ("entropy", 0.6), ("entropy", 0.69),
            ("confidence", 0.0), ("confidence", 0.7), ("confidence", 0.95),
            ("confidence", 1.0), ("patience", 1), ("patience", 2)]  # fmt: skip


@pytest.fixture(scope="module", params=["mean", "cls", "layer-attention"])
def model_and_batch(request, tiny_model_dir):
    torch.manual_seed(0)
    encoder = load_encoder(str(tiny_model_dir))
    model = MultiExitModel(encoder, ExitSpec(2, [1, 2, 3], request.param, 0.1)).eval()
    lengths = [3, 9, 5, 12, 7, 4, 10, 6, 8, 11, 5, 12]
    input_ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, n in enumerate(lengths):
        input_ids[i, :n] = torch.randint(5, 30, (n,))
        mask[i, :n] = 1
    with torch.no_grad():  # logits with a spread of about 1.5, so that every policy splits
        for head, logits in zip(model.heads, model(input_ids, mask).logits):
            head.classifier.weight.mul_(1.5 / logits.std())
    return model, input_ids, mask


@pytest.mark.parametrize(("policy", "threshold"), SETTINGS)
def test_runtime_equals_policy_on_all_exit_logits(model_and_batch, policy, threshold) -> None:
    model, input_ids, mask = model_and_batch
    with torch.no_grad():
        all_logits = model(input_ids, mask).logits  # [E, B, C]
    expected = exit_indices(policy, threshold, all_logits)
    runtime = EarlyExitRuntime(model, policy, threshold)
    batched = runtime(input_ids, mask)
    assert batched.exit_index.tolist() == expected.tolist()
    picked = all_logits[torch.as_tensor(expected), torch.arange(len(expected))]
    torch.testing.assert_close(batched.logits, picked, atol=1e-5, rtol=1e-4)
    assert batched.exit_layer.tolist() == [model.spec.exits[i] for i in expected]
    for i in range(input_ids.shape[0]):  # batch size 1, each sample without its padding
        n = int(mask[i].sum())
        one = runtime(input_ids[i : i + 1, :n], mask[i : i + 1, :n])
        assert one.exit_index.item() == expected[i]
        torch.testing.assert_close(one.logits[0], picked[i], atol=1e-5, rtol=1e-4)


def test_full_forward_is_the_deepest_exit(model_and_batch) -> None:
    model, input_ids, mask = model_and_batch
    with torch.no_grad():
        expected = model(input_ids, mask).logits[-1]
    torch.testing.assert_close(full_forward(model, input_ids, mask), expected, atol=1e-5, rtol=1e-4)


def test_full_forward_to_any_exit(model_and_batch) -> None:
    """With ``exit_index`` it runs up to that exit and its head only (the benchmark's oracle)."""
    model, input_ids, mask = model_and_batch
    with torch.no_grad():
        expected = model(input_ids, mask).logits
    for k in range(model.num_exits):
        got = full_forward(model, input_ids, mask, exit_index=k)
        torch.testing.assert_close(got, expected[k], atol=1e-5, rtol=1e-4)


def test_settings_split_the_batch(model_and_batch) -> None:
    """The fixture is informative: some settings exit samples at different layers."""
    model, input_ids, mask = model_and_batch
    with torch.no_grad():
        all_logits = model(input_ids, mask).logits
    spread = {(p, t): len(set(exit_indices(p, t, all_logits).tolist())) for p, t in SETTINGS}
    splitting = [("entropy", 0.2), ("entropy", 0.6), ("confidence", 0.7), ("confidence", 0.95),
                 ("patience", 1)]  # fmt: skip
    assert all(spread[setting] > 1 for setting in splitting), spread
