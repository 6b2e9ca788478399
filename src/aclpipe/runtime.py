"""The early-exit runtime: run the encoder layer by layer and stop per sample.

After each exit the policy (``aclpipe.policies.exits_now``) decides, sample by sample, who
leaves; those samples leave the batch and the rest go on, so no layer runs for a finished
sample. Padding columns that only finished samples needed are trimmed as the batch shrinks
(batches are right-padded). The full model baseline (``full_forward``) runs the same layers
with only the deepest exit's head, so the two are timed on equal terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aclpipe.model import MultiExitModel, additive_mask
from aclpipe.policies import check_threshold, exits_now


@dataclass
class EarlyExitResult:
    logits: torch.Tensor  # [B, C], the logits at the exit each sample left by
    exit_index: torch.Tensor  # [B], 0-based index into model.spec.exits
    exit_layer: torch.Tensor  # [B], the 1-based layer of that exit


def _layer_call(layer, hidden: torch.Tensor, mask4d: torch.Tensor) -> torch.Tensor:
    out = layer(hidden, mask4d)
    return out[0] if isinstance(out, tuple) else out


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
        self.model, self.policy, self.threshold = model.eval(), policy, threshold
        self.regression, self.eps = regression, eps
        self.layers = model.layer_modules()
        self.exit_at = {layer: i for i, layer in enumerate(model.spec.exits)}  # layer -> exit index
        self.keep_all_layers = model.spec.pooling == "layer-attention"  # it reads h_0..h_k
        self.exit_layers = torch.tensor(model.spec.exits)
        # how many exits' logits the policy reads: patience t looks at exits k-t..k
        self.window = int(threshold) + 1 if policy == "patience" else 1

    @torch.no_grad()
    def __call__(self, input_ids, attention_mask, token_type_ids=None) -> EarlyExitResult:
        model, batch = self.model, input_ids.shape[0]
        last_exit = model.num_exits - 1
        out_logits = torch.empty(batch, model.spec.num_labels)
        out_index = torch.full((batch,), last_exit, dtype=torch.long)
        active = torch.arange(batch)  # original positions of the samples still running
        mask = attention_mask
        hidden = model.embed(input_ids, token_type_ids)  # [b, T, H]
        mask4d = additive_mask(mask, hidden.dtype)  # rebuilt only when the batch shrinks
        kept = [hidden]  # h_0..h_k for the running samples (only h_k unless layer attention)
        seen: list[torch.Tensor] = []  # the last `window` exits' logits, [b, C] each
        for depth, layer in enumerate(self.layers[: model.spec.exits[-1]], start=1):
            hidden = _layer_call(layer, hidden, mask4d)
            kept = kept + [hidden] if self.keep_all_layers else [hidden]
            if depth not in self.exit_at:
                continue
            k = self.exit_at[depth]
            head = model.heads[k]
            logits = head.classifier(head.pooler(kept, mask))  # [b, C]
            if k == last_exit:  # everyone still running leaves here
                out_logits[active], out_index[active] = logits.float(), k
                break
            seen = seen[len(seen) + 1 - self.window :] + [logits]
            leave = exits_now(
                self.policy, self.threshold, torch.stack(seen), self.regression, self.eps
            )
            leaving = int(leave.sum())
            if leaving == 0:
                continue
            if leaving == len(active):
                out_logits[active], out_index[active] = logits.float(), k
                break
            out_logits[active[leave]], out_index[active[leave]] = logits[leave].float(), k
            stay = ~leave
            active, mask = active[stay], mask[stay]
            longest = int(mask.sum(dim=1).max())  # trim padding only finished samples needed
            mask = mask[:, :longest]
            mask4d = additive_mask(mask, hidden.dtype)
            kept = [h[stay, :longest] for h in kept]
            hidden = kept[-1]
            seen = [s[stay] for s in seen]
        return EarlyExitResult(out_logits, out_index, self.exit_layers[out_index])


@torch.no_grad()
def full_forward(model: MultiExitModel, input_ids, attention_mask, token_type_ids=None):
    """The model without early exit: every layer up to the deepest exit, and its head only.

    The caller puts the model in eval mode (as ``EarlyExitRuntime`` does on construction)."""
    hidden = model.embed(input_ids, token_type_ids)
    kept = [hidden]
    keep_all = model.spec.pooling == "layer-attention"
    mask4d = additive_mask(attention_mask, hidden.dtype)
    for layer in model.layer_modules()[: model.spec.exits[-1]]:
        hidden = _layer_call(layer, hidden, mask4d)
        kept = kept + [hidden] if keep_all else [hidden]
    head = model.heads[-1]
    return head.classifier(head.pooler(kept, attention_mask))  # [B, C]
