"""The early-exit runtime: run the encoder layer by layer and stop per sample.

After each exit the policy (``aclpipe.early_exit.policies.leaves``) decides, sample by sample, who
leaves; those samples leave the batch and the rest go on, so no layer runs for a finished
sample. Padding columns that only finished samples needed are trimmed as the batch shrinks
(batches are right-padded). That bookkeeping is ``aclpipe.early_exit.core.run_exits``, shared
with the ONNX Runtime engine; this module runs the layers between two exits and an exit's head. The full model baseline (``full_forward``) runs the same layers
with only the deepest exit's head, so the two are timed on equal terms. Both run the encoder
through the model's ``LayerRunner`` (``aclpipe.modeling.layerwise``), checked once per model
against its forward (``check_layerwise``).
"""

from __future__ import annotations

import torch

from aclpipe.early_exit.core import ArrayOps, EarlyExitResult, run_exits
from aclpipe.early_exit.policies import check_policy, check_threshold, window_size
from aclpipe.modeling.layer_guard import check_layerwise
from aclpipe.modeling.model import MultiExitModel

TORCH_OPS = ArrayOps(
    full=lambda n, value: torch.full((n,), value, dtype=torch.long),
    empty_rows=lambda n, rows: rows.new_empty(n, rows.shape[1]),
    arange=torch.arange,
    flags=torch.tensor,
)


class EarlyExitRuntime:
    """Batched early exit with a per-sample policy; nothing is stored on the model."""

    def __init__(
        self,
        model: MultiExitModel,
        policy: str,
        threshold: float,
        regression: bool = False,
        eps: float = 0.1,
    ) -> None:
        check_threshold(policy, threshold, model.spec.num_labels, model.num_exits)
        check_policy(policy, regression)
        self.model, self.policy, self.threshold = model.eval(), policy, threshold
        self.regression, self.eps = regression, eps
        check_layerwise(model)  # once per model: a UserError if layers alone miss something
        self.runner = model.layer_runner()
        calls = self.runner.calls  # layer j: calls[j - 1]
        starts = [0, *model.spec.exits[:-1]]
        self.stretches = [calls[a:b] for a, b in zip(starts, model.spec.exits)]  # per exit
        self.keep_all_layers = any(head.pooler.reads_all_layers for head in model.heads)
        self.exit_layers = torch.tensor(model.spec.exits)
        self.heads = [head.logits for head in model.heads]
        # how many exits' logits the policy reads: patience t looks at exits k-t..k
        self.window = window_size(policy, threshold)

    @torch.inference_mode()
    def __call__(self, input_ids, attention_mask, token_type_ids=None) -> EarlyExitResult:
        run = _TorchPass(self, input_ids, attention_mask, token_type_ids)
        return run_exits(run, TORCH_OPS, self.exit_layers, self.policy, self.threshold,
                         self.window, self.regression, self.eps)  # fmt: skip


class _TorchPass:
    """One batch through the model's layers (``core.ExitPass``)."""

    def __init__(self, runtime: EarlyExitRuntime, input_ids, attention_mask, token_type_ids):
        self.runner, self.stretches, self.heads = runtime.runner, runtime.stretches, runtime.heads
        self.keep_all_layers = runtime.keep_all_layers
        self.mask = attention_mask
        hidden = self.runner.embed(input_ids, attention_mask, token_type_ids)  # [b, T, H]
        self.pool_mask = _padding(attention_mask)  # None when nothing is padded
        self.inputs = self.runner.inputs(hidden, self.pool_mask)  # what each layer takes too
        self.kept = [hidden]  # h_0..h_j of the running samples (h_j alone unless a pooler
        # reads every layer)

    def logits(self, k: int) -> torch.Tensor:
        kept, inputs = self.kept, self.inputs
        hidden = kept[-1]
        for call in self.stretches[k]:  # the layers since the previous exit
            hidden = call(hidden, inputs)
            kept = kept + [hidden] if self.keep_all_layers else [hidden]
        self.kept = kept
        return self.heads[k](kept, self.pool_mask).float()  # [b, C]

    def keep(self, stay: torch.Tensor, mask: torch.Tensor) -> None:
        longest = mask.shape[1]
        self.mask, self.kept = mask, [h[stay, :longest] for h in self.kept]
        self.pool_mask = _padding(mask)
        self.inputs = self.runner.inputs(self.kept[-1], self.pool_mask)


def _padding(mask: torch.Tensor) -> torch.Tensor | None:
    """``mask``, or ``None`` when no token is padding (always so at batch 1): the layers then
    get no mask and the poolers a plain mean. Adding an all-zero mask changes nothing."""
    return None if bool(mask.all()) else mask


@torch.inference_mode()
def full_forward(
    model: MultiExitModel, input_ids, attention_mask, token_type_ids=None, exit_index: int = -1
):
    """The model without early exit: every layer up to an exit (the deepest by default), and
    that exit's head only (``MultiExitModel.exit_logits``).

    It takes the same shortcuts as the runtime (no mask when nothing is padded, inference
    mode), so the two are timed on equal terms. With the exit each sample will take known in
    advance, it is also the floor no early-exit runtime can beat (the benchmark's oracle). The
    caller puts the model in eval mode (as ``EarlyExitRuntime`` does on construction)."""
    (logits,) = model.exit_logits([exit_index], input_ids, attention_mask, token_type_ids)
    return logits.float()  # [B, C]
