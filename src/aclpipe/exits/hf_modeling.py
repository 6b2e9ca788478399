"""An aclpipe multi-exit classifier as a Hugging Face model, with torch and transformers alone.

``aclpipe export-hf`` copies this file into the model folder as ``modeling_aclpipe.py`` and
points ``config.json``'s ``auto_map`` at it, so that::

    AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)
    pipeline("text-classification", model=folder, trust_remote_code=True)

load the model anywhere transformers runs, without aclpipe installed. It imports nothing of
aclpipe; the parameter names are aclpipe's own (``encoder.*``, ``heads.<i>.*``), so the
trained ``model.safetensors`` loads unchanged.

The model is any Hugging Face encoder with one head per exit layer (``config.exits``); each
head pools (``cls``: ``tanh(W h[CLS] + b)``; ``mean``: the masked mean of the tokens;
``layer-attention``: Oh et al. 2022 over ``h_0..h_k``) and applies a linear classifier.
``forward`` returns the deepest exit's logits as ``logits [B, C]`` (the full model) and every
exit's as ``exit_logits [E, B, C]``. The exit policy is data in the config
(``exit_policy``, ``exit_threshold``, ``patience_eps``); ``exit_decisions`` applies it per
sample to ``exit_logits``. This gives the same answers as aclpipe's early-exit runtime; it
does not skip the layers a sample no longer needs, which only that runtime does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

EXIT_POLICIES = ("none", "entropy", "patience", "confidence")


class AclpipeConfig(PretrainedConfig):
    """The encoder's own config (``encoder``, a dict with its ``model_type``) and the heads."""

    model_type = "aclpipe_multi_exit"

    def __init__(
        self,
        encoder: dict | None = None,
        exits: list[int] | None = None,  # 1-based layers with a head, ascending
        pooling: str = "cls",  # cls | mean | layer-attention
        cls_from_mean: bool = False,  # layer-attention: masked means stand in for [CLS]
        label_embedding: str = "classifier",  # classifier | separate (a label table per exit)
        exit_policy: str = "none",  # none (the deepest exit) | entropy | patience | confidence
        exit_threshold: float | None = None,  # entropy S, patience t, confidence delta
        patience_eps: float = 0.1,  # regression patience: outputs agree when |diff| < eps
        **kwargs,
    ) -> None:
        self.encoder = dict(encoder or {})
        self.exits = list(exits or [])
        self.pooling = pooling
        self.cls_from_mean = cls_from_mean
        self.label_embedding = label_embedding
        self.exit_policy = exit_policy
        self.exit_threshold = exit_threshold
        self.patience_eps = patience_eps
        super().__init__(**kwargs)


@dataclass
class MultiExitOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # [B, C], the deepest exit's
    exit_logits: torch.Tensor | None = None  # [E, B, C]
    features: torch.Tensor | None = None  # [E, B, H], each exit's pooled vector


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask.unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)  # [B, H]


class ClsPooler(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[-1][:, 0]))  # [B, H]


class MeanPooler(nn.Module):
    def forward(self, hidden: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        return masked_mean(hidden[-1], mask)  # [B, H]


class LayerAttentionPooler(nn.Module):
    """Layer-wise attention pooling over ``h_0..h_k`` (Oh et al., COLING 2022), as released."""

    def __init__(self, hidden_size: int, cls_from_mean: bool) -> None:
        super().__init__()
        self.cls_from_mean = cls_from_mean
        self.query = nn.Sequential(nn.Linear(hidden_size, hidden_size, bias=False), nn.RReLU())
        self.key = nn.Sequential(nn.Linear(hidden_size, hidden_size, bias=False), nn.RReLU())
        self.value = nn.Sequential(nn.Linear(hidden_size, hidden_size, bias=False), nn.RReLU())
        self.dense = nn.Linear(2 * hidden_size, hidden_size)

    def forward(self, hidden: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        means = torch.stack([masked_mean(h, mask) for h in hidden], dim=1)  # [B, k+1, H]
        heads = means if self.cls_from_mean else torch.stack([h[:, 0] for h in hidden], dim=1)
        queries, keys, values = self.query(heads), self.key(means), self.value(means)
        scores = torch.einsum("bih,bjh->bij", queries, keys) / keys.shape[1]  # [B, k+1, k+1]
        weights = scores.float().softmax(dim=-1).mean(dim=1).to(values.dtype)  # [B, k+1]
        attended = torch.einsum("bj,bjh->bh", weights, values)  # [B, H]
        return torch.tanh(self.dense(torch.cat([heads[:, -1], attended], dim=-1)))  # [B, H]


class ExitHead(nn.Module):
    def __init__(self, config: AclpipeConfig, hidden_size: int, dropout: float) -> None:
        super().__init__()
        if config.pooling == "cls":
            self.pooler = ClsPooler(hidden_size)
        elif config.pooling == "mean":
            self.pooler = MeanPooler()
        else:
            self.pooler = LayerAttentionPooler(hidden_size, config.cls_from_mean)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden_size, config.num_labels)
        if config.label_embedding == "separate":  # trained beside the classifier; unused here
            self.label_table = nn.Parameter(torch.zeros(config.num_labels, hidden_size))


class AclpipePreTrainedModel(PreTrainedModel):
    config_class = AclpipeConfig
    base_model_prefix = "encoder"

    def _init_weights(self, module: nn.Module) -> None:  # every weight comes from the file
        pass


class AclpipeForSequenceClassification(AclpipePreTrainedModel):
    def __init__(self, config: AclpipeConfig) -> None:
        super().__init__(config)
        settings = dict(config.encoder)
        encoder_config = AutoConfig.for_model(settings.pop("model_type"), **settings)
        self.encoder = AutoModel.from_config(encoder_config)
        if getattr(self.encoder, "pooler", None) is not None:
            self.encoder.pooler = None  # each exit has its own pooler
        hidden = encoder_config.hidden_size
        dropout = getattr(encoder_config, "hidden_dropout_prob", 0.1)
        self.heads = nn.ModuleList(ExitHead(config, hidden, dropout) for _ in config.exits)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,  # [B, T]
        attention_mask: torch.Tensor | None = None,  # [B, T]
        token_type_ids: torch.Tensor | None = None,  # [B, T]
        labels: torch.Tensor | None = None,  # [B]
        return_dict: bool | None = None,
        **kwargs,
    ) -> MultiExitOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                           output_hidden_states=True, **extra)  # fmt: skip
        hidden = out.hidden_states  # L + 1 tensors [B, T, H]; hidden[0] = embeddings
        features = torch.stack([
            head.pooler(list(hidden[: layer + 1]), attention_mask)
            for head, layer in zip(self.heads, self.config.exits)
        ])  # fmt: skip  # [E, B, H]
        exit_logits = torch.stack([
            head.classifier(head.dropout(z)) for head, z in zip(self.heads, features)
        ])  # fmt: skip  # [E, B, C]
        logits = exit_logits[-1]  # [B, C]
        loss = None
        if labels is not None:
            if self.config.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
            else:
                loss = F.cross_entropy(logits, labels)
        return MultiExitOutput(loss=loss, logits=logits, exit_logits=exit_logits,
                               features=features)  # fmt: skip

    def exit_decisions(
        self, exit_logits: torch.Tensor, policy: str | None = None, threshold: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [B, C], exit layer [B])``: each sample's logits at the first exit where the
        policy (default: the config's) lets it leave, else at the deepest exit."""
        return exit_decisions(
            exit_logits, self.config.exits, policy or self.config.exit_policy,
            self.config.exit_threshold if threshold is None else threshold,
            self.config.patience_eps,
        )  # fmt: skip


def exit_decisions(
    exit_logits: torch.Tensor, exits: list[int], policy: str, threshold: float | None,
    eps: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Per sample, from every exit's logits ``[E, B, C]``:

    - ``entropy``: leave at the first exit where ``H(softmax(z)) < threshold`` (natural log);
    - ``confidence``: where ``max softmax(z) >= threshold``;
    - ``patience`` ``t``: where the argmax has been the same at this exit and the ``t`` before
      it (one output: ``|z_j - z_{j-1}| < eps`` for those steps);
    - ``none``: at the deepest exit. No criterion met: the deepest exit.
    """
    if policy not in EXIT_POLICIES:
        raise ValueError(f"unknown exit policy {policy!r}: use one of {', '.join(EXIT_POLICIES)}")
    num_exits = exit_logits.shape[0]
    z = exit_logits.float()  # [E, B, C]
    if policy == "none":
        leave = torch.zeros(z.shape[:2], dtype=torch.bool)  # [E, B]
    elif policy == "entropy":
        logp = z.log_softmax(dim=-1)
        leave = -(logp.exp() * logp).sum(dim=-1) < threshold  # [E, B]
    elif policy == "confidence":
        leave = z.softmax(dim=-1).amax(dim=-1) >= threshold  # [E, B]
    else:
        t = int(threshold)
        if z.shape[-1] == 1:
            agree = (z[1:, :, 0] - z[:-1, :, 0]).abs() < eps  # [E-1, B]
        else:
            top = z.argmax(dim=-1)  # [E, B], first of ties
            agree = top[1:] == top[:-1]  # [E-1, B]
        leave = torch.zeros(z.shape[:2], dtype=torch.bool)  # [E, B]
        for k in range(t, num_exits):
            leave[k] = agree[k - t : k].all(dim=0)
    leave[-1] = True
    first = leave.to(torch.int64).argmax(dim=0)  # [B], the first exit left at
    chosen = exit_logits[first, torch.arange(first.shape[0])]  # [B, C]
    layers = torch.tensor(exits, device=first.device)[first]  # [B]
    return chosen, layers
