"""The whole-model guard: does the layer-by-layer run reproduce the model's own forward?

Every path that runs a model layer by layer (the early-exit runtime, the exported exit graphs)
asks ``check_layerwise`` first. It sits above the model (``aclpipe.modeling.model``) and the
per-family runners below it (``aclpipe.modeling.layerwise``), and compares the two on probe
batches once per model object.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from aclpipe.errors import UserError
from aclpipe.modeling.layerwise import runner_for
from aclpipe.modeling.model import MultiExitModel, forward_to_exits

# Layer by layer against forward, logits at every exit, on the probe batch: at most this
# times max(1, the largest |logit|). Measured: 0 on tiny random models of every family in
# RUNNERS and on all-MiniLM-L6-v2 (the same batch, the same kernels); the no-mask shortcut on
# other batches, about 1e-6. A layer fed wrong inputs (no mask, no position bias) is off by
# 1e-4 (a random MPNet's near-zero bias table) to 1e-1 and more.
GUARD_TOLERANCE = 1e-5

_verdicts: weakref.WeakKeyDictionary[nn.Module, float] = weakref.WeakKeyDictionary()


def probe_batches(config) -> list[dict[str, torch.Tensor]]:
    """Two short rows of different lengths (right-padded), then the shorter alone (no padding):
    real token ids above the usual special ids, token types where the model has them."""
    vocab, low = config.vocab_size, min(5, config.vocab_size - 1)
    lengths, batches = [6, 4], []
    ids = torch.zeros(2, 6, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = low + (torch.arange(n) * 7 + row * 3) % (vocab - low)
        mask[row, :n] = 1
    ids[mask == 0] = config.pad_token_id or 0
    types = (torch.arange(6) >= 3).long().expand(2, 6) * mask
    with_types = (getattr(config, "type_vocab_size", 0) or 0) > 1
    for rows, width in ((slice(0, 2), 6), (slice(1, 2), lengths[1])):
        batch = {"input_ids": ids[rows, :width], "attention_mask": mask[rows, :width]}
        if with_types:
            batch["token_type_ids"] = types[rows, :width]
        batches.append(batch)
    return batches


def check_layerwise(model: MultiExitModel) -> float:
    """Raise ``UserError`` unless the layer run reproduces ``model``'s forward: logits at every
    exit on ``probe_batches``, within ``GUARD_TOLERANCE`` (eval mode). Returns the largest
    difference. Run once per model object (the verdict is kept), so building many runtimes
    on one model, as a sweep does, costs one check."""
    if model in _verdicts:
        return _verdicts[model]
    name = type(model.encoder).__name__
    runner = runner_for(model.encoder)
    training = model.training
    model.eval()
    worst, scale = 0.0, 1.0
    try:
        with torch.inference_mode():
            for batch in probe_batches(model.encoder.config):
                expected = model(**batch).logits  # [E, b, C]
                try:
                    got = torch.stack(forward_to_exits(runner, list(model.heads), **batch))
                except Exception as err:  # a layer that takes other inputs fails in many ways
                    reason = (str(err).strip().splitlines() or [""])[0][:200]
                    raise UserError(
                        f"early exit layer by layer cannot run {name}: "
                        f"{type(err).__name__}: {reason}"
                    ) from err
                worst = max(worst, float((got - expected).abs().max()))
                scale = max(scale, float(expected.abs().max()))
    finally:
        model.train(training)
    if not worst <= GUARD_TOLERANCE * scale:  # also catches NaN
        raise UserError(
            f"early exit layer by layer does not reproduce {name}'s forward (max diff "
            f"{worst:.2e} > {GUARD_TOLERANCE * scale:.1e}): its layers need inputs this runner "
            "does not give them; use a supported encoder or extend aclpipe.modeling.layerwise"
        )
    _verdicts[model] = worst
    return worst
