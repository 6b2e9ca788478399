"""The early-exit runtime: run the encoder layer by layer and stop per sample.

After each exit the policy (``aclpipe.early_exit.policies.leaves``) decides, sample by sample, who
leaves; those samples leave the batch and the rest go on, so no layer runs for a finished
sample. Padding columns that only finished samples needed are trimmed as the batch shrinks
(batches are right-padded). The full model baseline (``full_forward``) runs the same layers
with only the deepest exit's head, so the two are timed on equal terms. Both run the encoder
through the model's ``LayerRunner`` (``aclpipe.modeling.layerwise``), checked once per model
against its forward (``check_layerwise``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aclpipe.early_exit.policies import check_policy, check_threshold, step, window_size
from aclpipe.modeling.layer_guard import check_layerwise
from aclpipe.modeling.model import MultiExitModel


@dataclass
class EarlyExitResult:
    logits: torch.Tensor  # [B, C], the logits at the exit each sample left by
    exit_index: torch.Tensor  # [B], 0-based index into model.spec.exits
    exit_layer: torch.Tensor  # [B], the 1-based layer of that exit


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
        self.calls = self.runner.calls[: model.spec.exits[-1]]  # layer k: calls[k - 1]
        self.exit_at = {layer: i for i, layer in enumerate(model.spec.exits)}  # layer -> exit index
        self.keep_all_layers = any(head.pooler.reads_all_layers for head in model.heads)
        self.exit_layers = torch.tensor(model.spec.exits)
        self.heads = [head.logits for head in model.heads]
        # how many exits' logits the policy reads: patience t looks at exits k-t..k
        self.window = window_size(policy, threshold)

    @torch.inference_mode()
    def __call__(self, input_ids, attention_mask, token_type_ids=None) -> EarlyExitResult:
        model, runner, batch = self.model, self.runner, input_ids.shape[0]
        last_exit = model.num_exits - 1
        out_logits: torch.Tensor | None = None  # filled when a first sample leaves
        out_index = torch.full((batch,), last_exit, dtype=torch.long)
        active: torch.Tensor | None = None  # original positions of those running; None = all
        mask = attention_mask
        hidden = runner.embed(input_ids, mask, token_type_ids)  # [b, T, H]
        pool_mask = _padding(mask)  # None when nothing is padded; rebuilt when the batch shrinks
        inputs = runner.inputs(hidden, pool_mask)  # what each layer takes besides hidden
        kept = [hidden]  # h_0..h_k for the running samples (only h_k unless a pooler reads all)
        seen: list[list[list[float]]] = [[] for _ in range(batch)]  # per sample, its last
        # `window` exits' logits (patience t reads t + 1 of them, the others the newest one)
        for depth, call in enumerate(self.calls, start=1):
            hidden = call(hidden, inputs)
            kept = kept + [hidden] if self.keep_all_layers else [hidden]
            if depth not in self.exit_at:
                continue
            k = self.exit_at[depth]
            logits = self.heads[k](kept, pool_mask).float()  # [b, C]
            if k < last_exit:  # one tolist() and plain Python: see aclpipe.early_exit.policies
                seen, decided = step(self.policy, self.threshold, seen, logits.tolist(),
                                     self.window, self.regression, self.eps)  # fmt: skip
                leaving = sum(decided)
                if leaving == 0:
                    continue
            if k == last_exit or leaving == logits.shape[0]:  # everyone still running leaves
                if active is None:  # nobody left earlier: this exit's logits are the answer
                    out_index.fill_(k)
                    return EarlyExitResult(logits, out_index, self.exit_layers[out_index])
                out_logits[active], out_index[active] = logits, k
                break
            if out_logits is None:
                out_logits = logits.new_empty(batch, logits.shape[1])
                active = torch.arange(batch)
            leave = torch.tensor(decided)
            out_logits[active[leave]], out_index[active[leave]] = logits[leave], k
            stay = ~leave
            active, mask = active[stay], mask[stay]
            longest = int(mask.sum(dim=1).max())  # trim padding only finished samples needed
            mask = mask[:, :longest]
            kept = [h[stay, :longest] for h in kept]
            hidden = kept[-1]
            pool_mask = _padding(mask)
            inputs = runner.inputs(hidden, pool_mask)
            seen = [w for w, gone in zip(seen, decided) if not gone]
        return EarlyExitResult(out_logits, out_index, self.exit_layers[out_index])


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
