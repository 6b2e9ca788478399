"""The batched early-exit runtime decides exactly as the policy applied to all-exit logits."""

from __future__ import annotations

import math

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


# Property: the runtime decides as the offline policy, for every policy over its whole range ----

PROPERTY_LENGTHS = [3, 9, 5, 12, 7, 4, 10, 6, 8, 11]  # padded batch of mixed lengths
NUM_CLASSES = 3
LOGIT_ATOL = 1e-5  # runtime logits vs the model's forward at the same exit (float32)


def tiny_bert(num_layers: int) -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=num_layers,
                        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    return BertModel(config)


def property_batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.zeros(len(PROPERTY_LENGTHS), max(PROPERTY_LENGTHS), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, n in enumerate(PROPERTY_LENGTHS):
        input_ids[i, :n] = torch.randint(5, 60, (n,), generator=generator)
        mask[i, :n] = 1
    return input_ids, mask


@pytest.fixture(
    scope="module",
    params=[
        (layers, exits, pooling, heads)
        for layers, exits in [(8, list(range(1, 9))), (6, [1, 3, 4, 6])]
        for pooling in ["mean", "cls", "layer-attention"]
        for heads in ["copied", "random"]
    ],
    ids=lambda p: f"{p[0]}layers-exits{''.join(map(str, p[1]))}-{p[2]}-{p[3]}",
)
def property_model(request):
    """A tiny random multi-exit BERT. ``copied``: every inner head is a copy of the last head,
    so consecutive exits often agree and patience (even t >= 3) exits early; ``random``: heads
    of their own. Classifiers scaled so logits spread about 1.5 and every policy splits."""
    num_layers, exits, pooling, heads = request.param
    torch.manual_seed(0)
    spec = ExitSpec(NUM_CLASSES, exits, pooling, 0.1)
    model = MultiExitModel(tiny_bert(num_layers), spec).eval()
    input_ids, mask = property_batch()
    with torch.no_grad():
        if heads == "copied":
            for head in model.heads[:-1]:
                head.load_state_dict(model.heads[-1].state_dict())
        for head, logits in zip(model.heads, model(input_ids, mask).logits):
            head.classifier.weight.mul_(1.5 / logits.std())
    return model, input_ids, mask, heads


def property_grid(num_exits: int) -> list[tuple[str, float]]:
    """Patience 1..E-1; entropy 0..log C and confidence 0.5..1, both ends included."""
    entropy = [math.log(NUM_CLASSES) * i / 5 for i in range(6)]
    confidence = [0.5 + 0.1 * i for i in range(6)]
    return ([("patience", float(t)) for t in range(1, num_exits)]
            + [("entropy", s) for s in entropy] + [("confidence", d) for d in confidence])  # fmt: skip


@pytest.mark.slow
def test_runtime_equals_offline_policy_over_the_grid(property_model) -> None:
    """For every policy and threshold, padded batch and batch 1: the runtime's exit of every
    sample is the offline policy's (``exit_indices`` on the all-exit logits) and its logits are
    the model's at that exit (within ``LOGIT_ATOL``)."""
    model, input_ids, mask, _ = property_model
    with torch.no_grad():
        all_logits = model(input_ids, mask).logits  # [E, B, C]
    for policy, threshold in property_grid(model.num_exits):
        setting = f"{policy} {threshold:g}"
        expected = exit_indices(policy, threshold, all_logits)  # [B]
        picked = all_logits[torch.as_tensor(expected), torch.arange(len(expected))]  # [B, C]
        runtime = EarlyExitRuntime(model, policy, threshold)
        batched = runtime(input_ids, mask)
        assert batched.exit_index.tolist() == expected.tolist(), setting
        torch.testing.assert_close(batched.logits, picked, atol=LOGIT_ATOL, rtol=0, msg=setting)
        for i, n in enumerate(PROPERTY_LENGTHS):  # batch 1, without padding
            one = runtime(input_ids[i : i + 1, :n], mask[i : i + 1, :n])
            assert one.exit_index.item() == expected[i], f"{setting}, sample {i}"
            torch.testing.assert_close(one.logits[0], picked[i], atol=LOGIT_ATOL, rtol=0)


@pytest.mark.slow
def test_patience_three_and_more_exits_early(property_model) -> None:
    """Not vacuous: with heads that agree, patience t >= 3 sends samples out before the last
    exit, in the runtime, batched and one by one."""
    model, input_ids, mask, heads = property_model
    if heads != "copied":
        pytest.skip("random heads rarely agree 4 exits in a row")
    last = model.num_exits - 1
    if last <= 3:
        pytest.skip(f"{model.num_exits} exits: patience 3 can only leave at the last one")
    for t in range(3, last):  # t = E-1 needs every exit to agree: it leaves at the last one
        runtime = EarlyExitRuntime(model, "patience", t)
        batched = runtime(input_ids, mask).exit_index
        assert (batched < last).any(), f"patience {t}: {batched.tolist()}"
        ones = [runtime(input_ids[i : i + 1, :n], mask[i : i + 1, :n]).exit_index.item()
                for i, n in enumerate(PROPERTY_LENGTHS)]  # fmt: skip
        assert min(ones) < last, f"patience {t}, batch 1: {ones}"
