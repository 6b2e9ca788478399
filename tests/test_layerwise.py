"""Layer by layer equals the model's forward, for every encoder family in the runner table.

Tiny random encoders of each family (hidden 32, 3 layers, built offline from their configs):
the logits at every exit, run layer by layer (``forward_to_exits``, the runtime, the exit
graph), equal the model's forward on padded batches within ``ATOL``. The guard
(``check_layerwise``) passes on them and fires on a runner that feeds the layers wrongly.
"""

from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoConfig, AutoModel

from aclpipe.early_exit.policies import exit_indices
from aclpipe.early_exit.runtime import EarlyExitRuntime, full_forward
from aclpipe.errors import UserError
from aclpipe.exits.segments import EmbeddingsGraph, SegmentGraph, torch_chain
from aclpipe.modeling import layer_guard, layerwise
from aclpipe.modeling.layer_guard import GUARD_TOLERANCE, check_layerwise
from aclpipe.modeling.model import ExitSpec, MultiExitModel, forward_to_exits

ATOL = 1e-5  # layer by layer vs forward, logits of spread about 1.5 (float32)
SMALL = {"vocab_size": 60, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
         "intermediate_size": 37, "max_position_embeddings": 64}  # fmt: skip
FAMILIES = {
    "bert": ("bert", {}),
    "roberta": ("roberta", {"pad_token_id": 1}),
    "distilbert": ("distilbert", {"dim": 32, "n_layers": 3, "n_heads": 4, "hidden_dim": 37}),
    "electra": ("electra", {"embedding_size": 16}),  # h_0 goes through embeddings_project
    "mpnet": ("mpnet", {"pad_token_id": 1}),
    "deberta-v3": ("deberta-v2", {"relative_attention": True, "position_buckets": 16,
                                  "norm_rel_ebd": "layer_norm", "pos_att_type": ["p2c", "c2p"],
                                  "position_biased_input": False, "max_relative_positions": -1,
                                  "type_vocab_size": 0}),
    "deberta-v2-conv": ("deberta-v2", {"relative_attention": True, "position_buckets": 16,
                                       "norm_rel_ebd": "layer_norm", "conv_kernel_size": 3,
                                       "pos_att_type": ["p2c", "c2p"], "type_vocab_size": 2}),
}  # fmt: skip
LENGTHS = [3, 9, 5, 12, 7, 4]


def tiny_encoder(family: str) -> torch.nn.Module:
    model_type, extra = FAMILIES[family]
    config = AutoConfig.for_model(model_type, **{**SMALL, **extra})
    torch.manual_seed(0)
    return AutoModel.from_config(config)


def padded_batch(encoder: torch.nn.Module) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    pad = encoder.config.pad_token_id or 0
    input_ids = torch.full((len(LENGTHS), max(LENGTHS)), pad, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, n in enumerate(LENGTHS):
        input_ids[i, :n] = torch.randint(5, 60, (n,), generator=generator)
        mask[i, :n] = 1
    batch = {"input_ids": input_ids, "attention_mask": mask}
    if (getattr(encoder.config, "type_vocab_size", 0) or 0) > 1:
        batch["token_type_ids"] = (torch.arange(max(LENGTHS)) >= 4).long() * mask
    return batch


def build(family: str, pooling: str) -> tuple[MultiExitModel, dict[str, torch.Tensor]]:
    encoder = tiny_encoder(family)
    model = MultiExitModel(encoder, ExitSpec(3, [1, 2, 3], pooling, 0.1)).eval()
    batch = padded_batch(encoder)
    with torch.no_grad():  # logits with a spread of about 1.5, so differences show
        for head, logits in zip(model.heads, model(**batch).logits):
            head.classifier.weight.mul_(1.5 / logits.std())
    return model, batch


@pytest.mark.parametrize("pooling", ["mean", "cls", "layer-attention"])
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.slow
def test_layer_by_layer_equals_forward(family: str, pooling: str) -> None:
    model, batch = build(family, pooling)
    with torch.no_grad():
        expected = model(**batch).logits  # [E, B, C]
    every = list(range(model.num_exits))
    got = torch.stack(model.exit_logits(every, **batch))  # [E, B, C]
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    assert check_layerwise(model) <= ATOL
    for k in every:  # the baseline
        torch.testing.assert_close(full_forward(model, **batch, exit_index=k), expected[k],
                                   atol=ATOL, rtol=0)  # fmt: skip
    embeddings = EmbeddingsGraph(model, "token_type_ids" in batch).eval()  # the exported modules
    segments = [SegmentGraph(model, k).eval() for k in every]
    chained = [logits for _, logits in torch_chain(embeddings, segments, batch)[1:]]
    torch.testing.assert_close(torch.stack(chained), expected, atol=ATOL, rtol=0)
    for i, n in enumerate(LENGTHS):  # one row without its padding: the no-mask shortcut
        one = {name: t[i : i + 1, :n] for name, t in batch.items()}
        alone = torch.stack(model.exit_logits(every, **one))[:, 0]  # [E, C]
        torch.testing.assert_close(alone, expected[:, i], atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_runtime_equals_offline_policy(family: str) -> None:
    model, batch = build(family, "mean")
    with torch.no_grad():
        all_logits = model(**batch).logits  # [E, B, C]
    for policy, threshold in [("entropy", 0.9), ("confidence", 0.6), ("patience", 1)]:
        expected = exit_indices(policy, threshold, all_logits)
        result = EarlyExitRuntime(model, policy, threshold)(**batch)
        assert result.exit_index.tolist() == expected.tolist(), (policy, threshold)
        picked = all_logits[torch.as_tensor(expected), torch.arange(len(expected))]
        torch.testing.assert_close(result.logits, picked, atol=ATOL, rtol=0)


def test_guard_fires_on_a_wrong_layer_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """MPNet's layers run without their relative position bias: a one-line error naming the
    encoder, when the runtime or an export segment is built; nothing silent."""
    model, _ = build("mpnet", "mean")
    with torch.no_grad():  # a bias table away from its near-zero initialisation (std 0.02)
        model.encoder.encoder.relative_attention_bias.weight.normal_(std=0.5)

    def no_position_bias(self, hidden, mask):
        return (None if mask is None else layerwise.additive_mask(mask, hidden.dtype), None)

    monkeypatch.setattr(layerwise.MPNetRunner, "inputs", no_position_bias)
    for build_one in (lambda: EarlyExitRuntime(model, "entropy", 0.5),
                      lambda: SegmentGraph(model, 0)):  # fmt: skip
        with pytest.raises(UserError, match=r"does not reproduce MPNetModel's forward") as err:
            build_one()
        assert "\n" not in str(err.value) and "max diff" in str(err.value)


def test_guard_fires_on_a_layer_run_that_ignores_the_mask(monkeypatch: pytest.MonkeyPatch):
    """The probe batch is padded: a runner that drops the mask is caught too (BERT)."""
    model, _ = build("bert", "mean")
    monkeypatch.setattr(layerwise.LayerRunner, "inputs", lambda self, hidden, mask: None)
    with pytest.raises(UserError, match=r"does not reproduce BertModel's forward"):
        check_layerwise(model)


def test_guard_turns_a_crash_into_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = build("deberta-v3", "mean")
    monkeypatch.setattr(layerwise.DebertaV2Runner, "inputs", lambda self, hidden, mask: None)
    with pytest.raises(UserError, match=r"cannot run DebertaV2Model: TypeError") as err:
        EarlyExitRuntime(model, "entropy", 0.5)
    assert "\n" not in str(err.value)


def test_family_outside_the_table_is_one_line_error() -> None:
    config = AutoConfig.for_model("albert", **SMALL, embedding_size=16)
    model = MultiExitModel(AutoModel.from_config(config), ExitSpec(2, [3], "mean", 0.1))
    with torch.no_grad():  # training and the model's own forward still work
        model(torch.ones(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(UserError, match=r"not supported for AlbertModel \(model type 'albert'\)"):
        EarlyExitRuntime(model, "entropy", 0.5)


def test_guard_runs_once_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep builds a runtime per setting: the probe runs for the first one only."""
    model, _ = build("bert", "mean")
    calls = []
    real = layer_guard.forward_to_exits
    monkeypatch.setattr(
        layer_guard, "forward_to_exits", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    started = time.perf_counter()
    EarlyExitRuntime(model, "entropy", 0.5)
    first = time.perf_counter() - started
    probes = len(calls)
    for threshold in [0.1, 0.2, 0.3, 0.4]:
        EarlyExitRuntime(model, "entropy", threshold)
    assert probes == 2 and len(calls) == probes  # two probe batches, once
    assert first < 1.0
    assert check_layerwise(model) <= GUARD_TOLERANCE


def test_guard_restores_training_mode() -> None:
    model, _ = build("bert", "cls")
    model.train()
    check_layerwise(model)
    assert model.training and all(m.training for m in model.modules())
    assert forward_to_exits is layer_guard.forward_to_exits
