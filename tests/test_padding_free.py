"""Padding-free training forward against the encoder's own padded forward.

Tiny random encoders (hidden 32, 3 layers): every hidden state at every real token, the
gradients of a loss over them, and (with dropout on, seeded) the training-mode outputs, which
match because the dropout masks are drawn over the padded layout, as the padded forward draws
them. Families outside the table are refused by ``train.padding_free: true`` and skipped by
``auto``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModel

from aclpipe.errors import UserError
from aclpipe.layout import WEIGHTS
from aclpipe.modeling.padding_free import padding_free_hidden_states, use_padding_free

ATOL = 1e-5
SMALL = {"vocab_size": 60, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
         "intermediate_size": 37, "max_position_embeddings": 64}  # fmt: skip
SUPPORTED = {"bert": {}, "roberta": {"pad_token_id": 1}, "electra": {"embedding_size": 32}}
UNSUPPORTED = {
    "distilbert": {"dim": 32, "n_layers": 3, "n_heads": 4, "hidden_dim": 37},
    "mpnet": {"pad_token_id": 1},
    "electra": {"embedding_size": 16},  # h_0 goes through embeddings_project
}
LENGTH_SETS = {
    "mixed": [3, 9, 5, 12, 7, 1],  # a row of one token
    "unpadded": [6, 6, 6],
    "single": [4],
}


def tiny(model_type: str, **extra) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **{**SMALL, **extra})
    torch.manual_seed(0)
    return AutoModel.from_config(config)


def batch_of(lengths: list[int], pad: int, seed: int = 1) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(5, 60, (n,), generator=generator)
        mask[i, :n] = 1
    types = (torch.arange(ids.shape[1]) >= 2).long().expand_as(ids) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def padded_reference(encoder, batch) -> list[torch.Tensor]:
    return list(encoder(**batch, output_hidden_states=True).hidden_states)


def masked(states: list[torch.Tensor], mask: torch.Tensor) -> list[torch.Tensor]:
    return [h * mask[..., None] for h in states]  # padding positions are not compared


@pytest.mark.parametrize("lengths", LENGTH_SETS.values(), ids=LENGTH_SETS.keys())
@pytest.mark.parametrize("family", SUPPORTED)
def test_hidden_states_equal_the_padded_forward(family, lengths):
    encoder = tiny(family, **SUPPORTED[family]).eval()
    batch = batch_of(lengths, encoder.config.pad_token_id or 0)
    with torch.no_grad():
        want = masked(padded_reference(encoder, batch), batch["attention_mask"])
        got = padding_free_hidden_states(encoder, **batch)
    assert len(got) == len(want) == SMALL["num_hidden_layers"] + 1
    for layer, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=ATOL), (layer, float((a - b).abs().max()))
        pad = batch["attention_mask"] == 0
        assert not a[pad].any()  # zeros at padding, as promised


@pytest.mark.parametrize("family", SUPPORTED)
def test_gradients_equal_the_padded_forward(family):
    batch = batch_of(LENGTH_SETS["mixed"], SUPPORTED[family].get("pad_token_id", 0))
    mask = batch["attention_mask"]
    target = torch.randn(len(LENGTH_SETS["mixed"]), SMALL["hidden_size"])
    grads = []
    for free in (False, True):
        encoder = tiny(family, **SUPPORTED[family]).eval()  # no dropout: one function
        states = (
            padding_free_hidden_states(encoder, **batch) if free
            else padded_reference(encoder, batch)
        )  # fmt: skip
        pooled = [(h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True) for h in states]
        loss = sum(((p - target) ** 2).mean() for p in pooled) + states[-1][:, 0].pow(2).mean()
        loss.backward()
        grads.append(
            {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
        )
    padded, free = grads
    assert padded.keys() == free.keys()
    for name in padded:
        assert torch.allclose(padded[name], free[name], atol=ATOL), name


@pytest.mark.parametrize("family", SUPPORTED)
def test_dropout_draws_match_the_padded_forward(family):
    """Training mode, the same seed: the masks are drawn over the padded layout, so each real
    token gets the padded forward's mask and the outputs agree to rounding."""
    extra = {**SUPPORTED[family], "hidden_dropout_prob": 0.3, "attention_probs_dropout_prob": 0.2}
    encoder = tiny(family, **extra).train()
    batch = batch_of(LENGTH_SETS["mixed"], extra.get("pad_token_id", 0))
    torch.manual_seed(7)
    want = masked(padded_reference(encoder, batch), batch["attention_mask"])
    torch.manual_seed(7)
    got = padding_free_hidden_states(encoder, **batch)
    torch.manual_seed(8)
    other = padding_free_hidden_states(encoder, **batch)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=ATOL)
    assert not torch.allclose(other[-1], want[-1], atol=1e-3)  # dropout is really on


@pytest.mark.parametrize("family", UNSUPPORTED)
def test_unsupported_families(family):
    model_type = "electra" if family == "electra" else family
    encoder = tiny(model_type, **UNSUPPORTED[family])
    assert use_padding_free("auto", encoder) is False
    assert use_padding_free(False, encoder) is False
    with pytest.raises(UserError, match="train.padding_free cannot run"):
        use_padding_free(True, encoder)


@pytest.mark.parametrize("family", SUPPORTED)
def test_setting_resolution_on_supported(family):
    encoder = tiny(family, **SUPPORTED[family])
    assert use_padding_free("auto", encoder) is True
    assert use_padding_free(True, encoder) is True
    assert use_padding_free(False, encoder) is False


@pytest.mark.slow
def test_finetune_padding_free_matches_padded(
    make_params, tmp_path, glue_dir, tiny_model_dir_no_dropout
):
    """The whole loop (acl-cl: every exit, ACL-Grad's two backward passes) with and without
    padding on the dropout-free tiny BERT: the same weights up to float rounding."""
    from safetensors.torch import load_file

    from aclpipe.data.tasks import get_task
    from aclpipe.stages.finetune import finetune
    from aclpipe.stages.prepare import prepare

    weights = []
    for free in (False, True):
        params = make_params(
            model={"name": str(tiny_model_dir_no_dropout)},
            train={"padding_free": free, "epochs": 1, "batch_size": 8},
        )
        data = tmp_path / f"data-{free}"
        prepare(get_task("sst2"), params.data, params.model.name, data, glue_dir)
        out = tmp_path / f"model-{free}"
        finetune(get_task("sst2"), "acl-cl", params, data, out)
        weights.append(load_file(str(out / WEIGHTS)))
    padded, free = weights
    assert padded.keys() == free.keys()
    worst = max(float((padded[k] - free[k]).abs().max()) for k in padded)
    assert worst < 1e-5, worst


@pytest.mark.parametrize("pooling", ["cls", "mean", "layer-attention"])
def test_multi_exit_model_outputs_equal_the_padded_forward(pooling):
    """Every exit's features and logits through ``MultiExitModel.forward``, each pooling (cls
    reads position 0, mean and layer-attention mask the zeros at padding)."""
    from aclpipe.modeling.model import ExitSpec, MultiExitModel

    spec = ExitSpec(num_labels=3, exits=[1, 2, 3], pooling=pooling, dropout=0.1)
    model = MultiExitModel(tiny("bert"), spec).eval()
    batch = batch_of(LENGTH_SETS["mixed"], 0)
    with torch.no_grad():
        padded = model(**batch)
        free = model(**batch, padding_free=True)
    assert torch.allclose(free.features, padded.features, atol=ATOL)  # [E, B, D]
    assert torch.allclose(free.logits, padded.logits, atol=ATOL)  # [E, B, C]
