"""Every method through the training loop's own pieces, on a tiny random BERT.

One optimisation step per stage (``build_optimizer``, ``backward``, clip, ``optimizer.step``,
as in ``aclpipe.training.loop.train``) must change exactly the parameters the method trains; thirty
steps on a tiny separable batch must lower its loss.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aclpipe.config import Params
from aclpipe.errors import UserError
from aclpipe.modeling.backbone import load_encoder, load_tokenizer, resolve_model
from aclpipe.modeling.model import MultiExitModel
from aclpipe.training.grad_rules import AclGrad, GradientRegularization, PlainSum
from aclpipe.training.loop import backward, build_optimizer, make_spec
from aclpipe.training.methods import (
    METHODS,
    AclClKnobs,
    AclKnobs,
    LossInputs,
    Method,
    build_method,
    exit_weights,
)
from aclpipe.training.objectives import self_distill_loss

NUM_LAYERS = 3  # the tiny BERT of conftest.py
ALL = ("encoder", "final_exit", "inner_exits")
SINGLE_EXIT = {"ce", "scl", "acl"}
CONTRASTIVE = {"scl", "acl", "acl-cl", "cosine-pairs"}
SENTENCE = {"simcse-unsup", "simcse-sup"}  # sentence-embedding methods: tests/test_sentence_embeddings.py
CLASSIFIERS = sorted(set(METHODS) - SENTENCE)
# What each stage of each method trains: the groups whose every parameter must move.
EXPECTED_STAGES: dict[str, list[tuple[str, ...]]] = {
    "ce": [ALL],
    "scl": [ALL],
    "acl": [ALL],
    "joint": [ALL],
    "deebert": [("encoder", "final_exit"), ("inner_exits",)],
    "deebert-sd": [("encoder", "final_exit"), ("inner_exits",)],
    "romebert": [ALL],
    "acl-cl": [ALL],
    "cosine-pairs": [("encoder",)],  # its heads are refit after training (test_cosine_pairs.py)
    "simcse-unsup": [("encoder", "final_exit")],
    "simcse-sup": [("encoder", "final_exit")],
}
SENTENCES = [
    ("the movie was good .", 1), ("the movie was bad .", 0),
    ("this film is very good", 1), ("this film is very bad", 0),
    ("good plot and good acting", 1), ("bad plot and bad acting", 0),
    ("it is so good", 1), ("it is so bad", 0),
]  # fmt: skip


@pytest.fixture(scope="module")
def accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


@pytest.fixture(scope="module")
def inputs(tiny_model_dir: Path) -> dict[str, torch.Tensor]:
    tokenizer = load_tokenizer(str(tiny_model_dir))
    encoded = tokenizer([s for s, _ in SENTENCES], padding=True, return_tensors="pt")
    return {k: encoded[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


def class_labels() -> torch.Tensor:
    return torch.tensor([y for _, y in SENTENCES])  # [B]


def score_labels() -> torch.Tensor:
    return torch.tensor([4.5 if y else 0.5 for _, y in SENTENCES])  # [B], STS-B-like


def setup(name: str, params: Params, num_labels: int = 2) -> tuple[Method, MultiExitModel]:
    """The method and a fresh model on the tiny encoder, as ``finetune`` builds them."""
    torch.manual_seed(0)
    method = build_method(name, params.method(name))
    encoder = load_encoder(params.model.name)
    spec = make_spec(
        method,
        params.model,
        encoder.config.num_hidden_layers,
        num_labels,
        resolve_model(params.model.name),
        encoder.config.hidden_dropout_prob,
    )
    return method, MultiExitModel(encoder, spec)


def loss_inputs(model: MultiExitModel, inputs: dict, labels: torch.Tensor) -> LossInputs:
    out = model(**inputs)
    regression = labels.is_floating_point()
    return LossInputs(
        out.logits,
        out.features,
        model.label_embeddings(),
        labels,
        regression,
        exit_layers=model.spec.exits,
    )


def train_steps(model, stage, params: Params, accelerator, inputs, labels, steps: int) -> list:
    """``steps`` iterations of the body of ``aclpipe.training.loop.train``'s loop; their logs."""
    optimizer = build_optimizer(model, stage.trains, params.train)
    named_trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    logs = []
    model.train()
    for _ in range(steps):
        x = loss_inputs(model, inputs, labels)
        log = backward(stage, x, accelerator, model, named_trainable, params.train.record_angles)
        if params.train.max_grad_norm > 0:
            accelerator.clip_grad_norm_([p for _, p in named_trainable], params.train.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        logs.append(log)
    return logs


def snapshot(model: MultiExitModel) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed_since(model: MultiExitModel, before: dict[str, torch.Tensor]) -> set[str]:
    return {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}


def test_expectations_cover_every_method() -> None:
    assert set(EXPECTED_STAGES) == set(METHODS)


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_one_step_changes_exactly_the_trained_parameters(
    name: str, make_params: Callable[..., Params], accelerator, inputs
) -> None:
    # Weight decay 0: under AdamW a parameter with a zero gradient would still shrink.
    params = make_params(train={"lr": 1e-2, "head_lr": 1e-2, "weight_decay": 0.0})
    method, model = setup(name, params)
    assert model.spec.exits == ([NUM_LAYERS] if name in SINGLE_EXIT else [1, 2, 3])
    assert method.multi_exit == (name not in SINGLE_EXIT)
    groups = model.parameter_groups()
    assert [stage.trains for stage in method.stages] == EXPECTED_STAGES[name]
    for stage_index, trains in enumerate(EXPECTED_STAGES[name]):
        before = snapshot(model)
        logs = train_steps(model, method.stages[stage_index], params, accelerator, inputs,
                           class_labels(), steps=1)  # fmt: skip
        assert math.isfinite(logs[0]["loss"])
        expected = {n for group in trains for n in groups[group]}
        changed = changed_since(model, before)
        assert changed == expected, (
            f"{name} stage {stage_index + 1}: moved but frozen {sorted(changed - expected)[:4]}, "
            f"trained but unmoved {sorted(expected - changed)[:4]}"
        )
        frozen = [p for n, p in model.named_parameters() if n not in expected]
        assert all(not p.requires_grad for p in frozen)


@pytest.mark.parametrize("pooling", ["mean", "layer-attention"])
@pytest.mark.parametrize("name", ["joint", "deebert"])
def test_one_step_with_other_poolings(
    name: str, pooling: str, make_params: Callable[..., Params], accelerator, inputs
) -> None:
    params = make_params(train={"lr": 1e-2, "head_lr": 1e-2, "weight_decay": 0.0},
                         model={"pooling": pooling})  # fmt: skip
    method, model = setup(name, params)
    assert model.spec.pooling == pooling
    groups = model.parameter_groups()
    for stage_index, trains in enumerate(EXPECTED_STAGES[name]):
        before = snapshot(model)
        train_steps(model, method.stages[stage_index], params, accelerator, inputs,
                    class_labels(), steps=1)  # fmt: skip
        assert changed_since(model, before) == {n for g in trains for n in groups[g]}


@pytest.mark.parametrize("name", ["deebert", "deebert-sd"])
def test_deebert_stage_two_keeps_backbone_bitwise_under_weight_decay(
    name: str, make_params: Callable[..., Params], accelerator, inputs
) -> None:
    """Frozen parameters stay out of the optimizer, so even decay cannot move them."""
    params = make_params(train={"lr": 1e-2, "head_lr": 1e-2, "weight_decay": 0.1})
    method, model = setup(name, params)
    groups = model.parameter_groups()
    train_steps(model, method.stages[0], params, accelerator, inputs, class_labels(), steps=2)
    before = snapshot(model)
    train_steps(model, method.stages[1], params, accelerator, inputs, class_labels(), steps=3)
    changed = changed_since(model, before)
    assert changed == set(groups["inner_exits"])
    for name_ in groups["encoder"] + groups["final_exit"]:
        assert torch.equal(dict(model.named_parameters())[name_], before[name_])


def test_exit_weights() -> None:
    for n in (1, 2, 3, 6, 12):
        layers = list(range(1, n + 1))  # every layer an exit (the default)
        uniform, linear = exit_weights(layers, "uniform"), exit_weights(layers, "linear")
        assert sum(uniform) == pytest.approx(1.0) and sum(linear) == pytest.approx(1.0)
        assert uniform == pytest.approx([1 / n] * n)
        total = n * (n + 1) / 2
        assert linear == pytest.approx([k / total for k in range(1, n + 1)])
    assert exit_weights([1, 2, 3], "linear") == pytest.approx([1 / 6, 2 / 6, 3 / 6])


def test_linear_exit_weights_follow_the_exit_layers() -> None:
    """PABEE's l_k / sum l weighs an exit by its layer, not by its index among the exits."""
    assert exit_weights([1, 2, 6], "linear") == pytest.approx([1 / 9, 2 / 9, 6 / 9])
    assert exit_weights([1, 2, 6], "uniform") == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert sum(exit_weights([2, 5, 12], "linear")) == pytest.approx(1.0)


@pytest.mark.parametrize("weights", ["uniform", "linear"])
def test_joint_loss_matches_a_plain_reference(
    weights: str, make_params: Callable[..., Params], inputs
) -> None:
    params = make_params(methods={"joint": {"weights": weights}})
    method, model = setup("joint", params)
    x = loss_inputs(model.eval(), inputs, class_labels())
    w = [1, 1, 1] if weights == "uniform" else [1, 2, 3]
    reference = sum(wk * F.cross_entropy(x.logits[k], x.labels) for k, wk in enumerate(w)) / sum(w)
    torch.testing.assert_close(method.stages[0].main(x), reference)


@pytest.mark.parametrize("name", ["joint", "acl-cl"])
def test_linear_weights_use_exit_layers_not_exit_indices(
    name: str, make_params: Callable[..., Params]
) -> None:
    """Exits at layers 1, 2 and 6: ``linear`` weighs them 1/9, 2/9, 6/9, not 1/6, 2/6, 3/6."""
    params = make_params(methods={name: {"weights": "linear"}})
    method = build_method(name, params.method(name))
    logits = torch.tensor(
        [[[2.0, -1.0], [0.5, 0.0]], [[-1.0, 1.0], [3.0, -2.0]], [[0.0, 4.0], [1.0, 1.0]]]
    )  # [E=3, B=2, C=2], a different CE at each exit
    labels = torch.tensor([0, 1])  # [B]
    x = LossInputs(logits, torch.zeros(3, 2, 4), torch.zeros(3, 2, 4), labels, False,
                   exit_layers=[1, 2, 6])  # fmt: skip
    ce = [F.cross_entropy(logits[k], labels) for k in range(3)]
    torch.testing.assert_close(method.stages[0].main(x), (ce[0] + 2 * ce[1] + 6 * ce[2]) / 9)
    every_layer = dataclasses.replace(x, exit_layers=[1, 2, 3])  # the default: no change
    torch.testing.assert_close(
        method.stages[0].main(every_layer), (ce[0] + 2 * ce[1] + 3 * ce[2]) / 6
    )


def test_deebert_and_romebert_losses_match_a_plain_reference(
    make_params: Callable[..., Params], inputs
) -> None:
    params = make_params()
    deebert, model = setup("deebert", params)
    x = loss_inputs(model.eval(), inputs, class_labels())
    final_ce = F.cross_entropy(x.logits[-1], x.labels)
    inner_ce = F.cross_entropy(x.logits[0], x.labels) + F.cross_entropy(x.logits[1], x.labels)
    torch.testing.assert_close(deebert.stages[0].main(x), final_ce)
    torch.testing.assert_close(deebert.stages[1].main(x), inner_ce)
    cfg = params.method("romebert")
    romebert = build_method("romebert", cfg)
    sd = sum(self_distill_loss(x.logits[k], x.logits[-1], x.labels, cfg.gamma, cfg.T)
             for k in range(2))  # fmt: skip
    assert romebert.stages[0].rule == GradientRegularization(scope="encoder-weights")
    torch.testing.assert_close(romebert.stages[0].main(x), final_ce)
    torch.testing.assert_close(romebert.stages[0].aux(x), sd)


@pytest.mark.parametrize("name", CLASSIFIERS)
@pytest.mark.slow
def test_loss_falls_on_a_separable_batch(
    name: str, make_params: Callable[..., Params], accelerator, inputs
) -> None:
    # Mean pooling and lr 2e-3: every exit of the random encoder learns within 30 steps. (With
    # [CLS] pooling at lr 1e-3 RomeBERT's total rises: the final exit sharpens before the
    # inner exits follow, and the T^2-scaled KL to it grows faster than its CE falls.)
    params = make_params(train={"lr": 2e-3, "head_lr": 1e-2},
                         model={"dropout": 0.0, "pooling": "mean"})  # fmt: skip
    method, model = setup(name, params)
    for stage_index, stage in enumerate(method.stages):
        logs = train_steps(model, stage, params, accelerator, inputs, class_labels(), steps=30)
        losses = [log["loss"] for log in logs]
        assert all(math.isfinite(v) for v in losses)
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        assert last < 0.8 * first, f"{name} stage {stage_index + 1}: {first:.4f} -> {last:.4f}"


@pytest.mark.parametrize(("name", "knobs"), [("acl", {}), ("acl-cl", {}), ("scl", {"acl_grad": True})])
def test_acl_grad_logs_cosine_and_altered(
    name: str, knobs: dict, make_params: Callable[..., Params], accelerator, inputs
) -> None:
    params = make_params(methods={name: knobs})
    method, model = setup(name, params)
    stage = method.stages[0]
    assert stage.rule == AclGrad(max_angle=90, scope="encoder")
    logs = train_steps(model, stage, params, accelerator, inputs, class_labels(), steps=3)
    for log in logs:
        assert -1.0 <= log["cosine"] <= 1.0
        assert isinstance(log["altered"], bool)
        assert log["altered"] == (log["cosine"] < 0)
        assert log["grad_norm_ratio"] > 0
        assert log["loss"] == pytest.approx(log["main"] + log["aux"])


@pytest.mark.parametrize("name", ["acl", "scl"])
@pytest.mark.parametrize(("max_angle", "altered"), [(0.0, True), (180.0, False)])
def test_acl_grad_sets_the_combined_gradient(
    name: str, max_angle: float, altered: bool, make_params: Callable[..., Params], accelerator,
    inputs,
) -> None:
    """max_angle 0 drops the aux term (ACL's, or scl's SupCon with acl_grad) at every step;
    180 never does."""
    params = make_params(methods={name: {"max_angle": max_angle, "acl_grad": True}})
    method, model = setup(name, params)
    stage = method.stages[0]
    build_optimizer(model, stage.trains, params.train)  # sets requires_grad as the loop does
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    x = loss_inputs(model.eval(), inputs, class_labels())  # eval: one deterministic graph
    g_main = torch.autograd.grad(stage.main(x), [p for _, p in named], retain_graph=True)
    g_aux = torch.autograd.grad(stage.aux(x), [p for _, p in named], retain_graph=True,
                                allow_unused=True)  # fmt: skip
    log = backward(stage, x, accelerator, model, named, record_angles=False)
    assert log["altered"] is altered
    for (n, p), gm, ga in zip(named, g_main, g_aux, strict=True):
        expected = gm if altered or ga is None else gm + ga
        torch.testing.assert_close(p.grad, expected, msg=n)


def test_sum_rule_records_angles_when_asked(
    make_params: Callable[..., Params], accelerator, inputs
) -> None:
    params = make_params(train={"record_angles": True}, methods={"acl": {"acl_grad": False}})
    method, model = setup("acl", params)
    assert method.stages[0].rule == PlainSum(scope="encoder")
    (log,) = train_steps(model, method.stages[0], params, accelerator, inputs, class_labels(), 1)
    assert -1.0 <= log["cosine"] <= 1.0 and log["altered"] is False


@pytest.mark.parametrize("name", sorted(CONTRASTIVE))
def test_contrastive_methods_refuse_regression(
    name: str, make_params: Callable[..., Params], accelerator, inputs
) -> None:
    params = make_params()
    method, model = setup(name, params, num_labels=1)
    with pytest.raises(UserError, match="regression"):
        train_steps(model, method.stages[0], params, accelerator, inputs, score_labels(), 1)


@pytest.mark.parametrize("name", sorted(set(CLASSIFIERS) - CONTRASTIVE))
def test_other_methods_train_on_regression(
    name: str, make_params: Callable[..., Params], accelerator, inputs
) -> None:
    params = make_params()
    method, model = setup(name, params, num_labels=1)
    for stage in method.stages:
        (log,) = train_steps(model, stage, params, accelerator, inputs, score_labels(), 1)
        assert math.isfinite(log["loss"])


@pytest.mark.parametrize(
    "name",
    [
        "deebert",
        "deebert-sd",
        "romebert",
        "acl-cl",
        "cosine-pairs",
    ],
)
def test_multi_exit_methods_need_two_exits(
    name: str, make_params: Callable[..., Params], accelerator, inputs
) -> None:
    params = make_params(model={"exits": [3]})
    with pytest.raises(UserError, match="two exits"):  # before any training starts
        setup(name, params)


def test_unknown_method() -> None:
    with pytest.raises(UserError, match="unknown method 'acl_cl'"):
        build_method("acl_cl", Params().method("acl-cl"))


# Gradient rules as values ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "knobs", "rule"),
    [
        ("ce", {}, PlainSum()),
        ("scl", {}, PlainSum()),
        ("scl", {"acl_grad": True}, AclGrad(max_angle=90.0, scope="encoder")),
        ("acl", {}, AclGrad(max_angle=90.0, scope="encoder")),
        ("acl", {"max_angle": 45, "grad_scope": "all"}, AclGrad(max_angle=45.0, scope="all")),
        ("acl", {"acl_grad": False}, PlainSum(scope="encoder")),
        ("romebert", {}, GradientRegularization(scope="encoder-weights")),
        ("romebert", {"gr": False}, PlainSum(scope="encoder-weights")),
        ("acl-cl", {}, AclGrad(max_angle=90.0, scope="encoder")),
        ("acl-cl", {"acl_grad": False, "grad_scope": "all"}, PlainSum(scope="all")),
    ],
)
def test_stage_rule_is_a_value_built_from_the_knobs(
    name: str, knobs: dict, rule, make_params: Callable[..., Params]
) -> None:
    params = make_params(methods={name: knobs})
    (stage,) = build_method(name, params.method(name)).stages
    assert stage.rule == rule


def test_two_gradients_only_for_a_rule_that_needs_them_or_recorded_angles() -> None:
    """The one place that decides between one backward pass and two gradient passes."""
    methods = {name: build_method(name, Params().method(name)) for name in METHODS}
    for name, method in methods.items():
        for stage in method.stages:
            two = stage.separate_gradients(record_angles=False)
            assert two == (stage.aux is not None and not isinstance(stage.rule, PlainSum)), name
            assert stage.separate_gradients(record_angles=True) == (stage.aux is not None), name
    assert methods["acl"].stages[0].separate_gradients(record_angles=False)
    assert not methods["scl"].stages[0].separate_gradients(record_angles=False)
    assert not methods["joint"].stages[0].separate_gradients(record_angles=True)


def test_build_method_checks_the_knobs_type() -> None:
    with pytest.raises(TypeError, match="AclKnobs"):
        build_method("acl", AclClKnobs())
    assert build_method("acl", AclKnobs(max_angle=30.0)).stages[0].rule.max_angle == 30.0
