"""The multi-exit encoder: any Hugging Face encoder with one classifier per chosen layer.

One forward returns every exit at once (no exit decisions inside ``forward``):
``logits [E, B, C]`` and pooled ``features [E, B, D]``. Each exit head follows
BertForSequenceClassification's: pooler, dropout, linear (one output and MSE for STS-B).
Saved as safetensors plus a JSON config; no pickle anywhere.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model
from torch import nn

from aclpipe.errors import UserError
from aclpipe.layout import MODEL_CONFIG, WEIGHTS
from aclpipe.modeling.layerwise import LayerRunner, runner_for
from aclpipe.modeling.padding_free import padding_free_hidden_states
from aclpipe.modeling.pooling import ClsPooler, LayerAttentionPooler, MeanPooler


@dataclass
class ExitSpec:
    """What defines the heads on top of the encoder (saved next to the weights)."""

    num_labels: int  # classes, or 1 for regression
    exits: list[int]  # 1-based layers with a head, ascending; the last is the deepest exit
    pooling: str  # cls | mean | layer-attention
    dropout: float  # exit-head dropout
    label_embedding: str = "classifier"  # classifier | separate
    cls_from_mean: bool = (
        False  # layer-attention: mean vectors stand in for [CLS] (mean-pooled checkpoints)
    )


@dataclass
class ExitOutput:
    logits: torch.Tensor  # [E, B, C]
    features: torch.Tensor  # [E, B, D], pooled, before dropout
    label_embeddings: torch.Tensor  # [E, C, D], label_embeddings() read inside forward for DDP


def make_pooler(spec: ExitSpec, hidden_size: int, layer: int, init_from: nn.Linear | None):
    pooling = spec.pooling
    if pooling == "cls":
        return ClsPooler(hidden_size, init_from)
    if pooling == "mean":
        return MeanPooler()
    if pooling == "layer-attention":
        return LayerAttentionPooler(hidden_size, layer, cls_from_mean=spec.cls_from_mean)
    raise UserError(f"unknown pooling {pooling!r}: use cls, mean or layer-attention")


class ExitHead(nn.Module):
    def __init__(
        self,
        spec: ExitSpec,
        hidden_size: int,
        layer: int,
        init_range: float,
        pooler_init: nn.Linear | None,
    ) -> None:
        super().__init__()
        self.layer = layer
        self.pooler = make_pooler(spec, hidden_size, layer, pooler_init)
        self.dropout = nn.Dropout(spec.dropout)
        self.classifier = nn.Linear(hidden_size, spec.num_labels)
        nn.init.normal_(self.classifier.weight, std=init_range)
        nn.init.zeros_(self.classifier.bias)
        if spec.label_embedding == "separate":
            self.label_table = nn.Parameter(torch.randn(spec.num_labels, hidden_size) * init_range)

    def pool(self, hidden: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        """``z_k [B, D]`` from ``hidden = [h_0, ..., h_k]`` (before dropout)."""
        return self.pooler(hidden, mask)

    def classify(self, features: torch.Tensor) -> torch.Tensor:
        """``W_k · dropout(z_k) + b_k`` -> ``[B, C]``. As ``classifier(dropout(z))``, the same
        draws in training mode; in eval mode dropout is the identity and is not called."""
        if self.training:
            features = F.dropout(features, self.dropout.p, training=True)
        classifier = self.classifier
        return F.linear(features, classifier.weight, classifier.bias)

    def logits(self, hidden: list[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
        """``classify(pool(hidden, mask))`` in two function calls: inference reads it after
        every exit, where at batch 1 each module call costs more Python than the work inside
        (for mean pooling: a masked mean and a linear map). ``hidden`` may be ``[h_k]`` alone
        unless ``pooler.reads_all_layers``."""
        return self.classify(self.pooler.pool(hidden, mask))  # [B, C]


def forward_to_exits(
    runner: LayerRunner,
    heads: list[ExitHead],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    skip_unpadded_mask: bool = True,
) -> list[torch.Tensor]:
    """Logits ``[B, C]`` of each of ``heads`` (ascending layers): the embeddings, then layers
    ``1..`` the deepest head's, each head read right after its layer.

    ``skip_unpadded_mask``: build no mask when no token is padding (the runtime's shortcut); an
    exported graph keeps the mask (no branch on data)."""
    hidden = runner.embed(input_ids, attention_mask, token_type_ids)  # [B, T, H]
    unpadded = skip_unpadded_mask and bool(attention_mask.all())
    mask = None if unpadded else attention_mask
    inputs = runner.inputs(hidden, mask)
    keep_all = any(head.pooler.reads_all_layers for head in heads)
    at_layer = {head.layer: head for head in heads}
    kept, logits = [hidden], []  # h_0..h_k, or h_k alone when no pooler reads them all
    for depth, call in enumerate(runner.calls[: heads[-1].layer], start=1):
        hidden = call(hidden, inputs)
        kept = kept + [hidden] if keep_all else [hidden]
        if depth in at_layer:
            logits.append(at_layer[depth].logits(kept, mask))  # [B, C]
    return logits


class MultiExitModel(nn.Module):
    """An encoder (``self.encoder``) and one ``ExitHead`` per exit (``self.heads``)."""

    def __init__(self, encoder: nn.Module, spec: ExitSpec) -> None:
        super().__init__()
        num_layers = encoder.config.num_hidden_layers
        if not spec.exits or any(not 1 <= k <= num_layers for k in spec.exits):
            raise UserError(
                f"model.exits {spec.exits} must be layers in 1..{num_layers} "
                f"(this encoder has {num_layers} layers)"
            )
        spec.exits = sorted(set(spec.exits))
        self.spec = spec
        own_pooler = getattr(encoder, "pooler", None)
        pooler_init = getattr(own_pooler, "dense", None)
        if own_pooler is not None:
            encoder.pooler = None  # each exit has its own pooler; the shared one would sit unused
        self.encoder = encoder
        hidden = encoder.config.hidden_size
        init_range = getattr(encoder.config, "initializer_range", 0.02)
        self.heads = nn.ModuleList(
            ExitHead(spec, hidden, k, init_range, pooler_init) for k in spec.exits
        )

    @property
    def num_exits(self) -> int:
        return len(self.heads)

    @property
    def num_layers(self) -> int:
        return self.encoder.config.num_hidden_layers

    def forward(
        self, input_ids, attention_mask, token_type_ids=None, padding_free: bool = False
    ) -> ExitOutput:
        """Every exit at once. ``padding_free``: the encoder's linear layers skip padding
        (``modeling.padding_free``; the same function, for the families it supports)."""
        if padding_free:
            hidden = padding_free_hidden_states(
                self.encoder, input_ids, attention_mask, token_type_ids
            )  # L + 1 tensors [B, T, H], zeros at padding
        else:
            kwargs = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            out = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                output_hidden_states=True,
                **kwargs,
            )
            hidden = out.hidden_states  # L + 1 tensors [B, T, H]; hidden[0] = embeddings
        features = torch.stack(
            [head.pool(list(hidden[: head.layer + 1]), attention_mask) for head in self.heads]
        )  # [E, B, D]
        logits = torch.stack(
            [head.classify(z) for head, z in zip(self.heads, features)]
        )  # [E, B, C]
        return ExitOutput(
            logits=logits, features=features, label_embeddings=self.label_embeddings()
        )

    def layer_runner(self) -> LayerRunner:
        """The encoder run layer by layer, as its forward runs it (``modeling.layerwise``)."""
        return runner_for(self.encoder)

    def exit_logits(
        self,
        indices: list[int],
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        skip_unpadded_mask: bool = True,
    ) -> list[torch.Tensor]:
        """Logits ``[B, C]`` at the exits ``indices`` (ascending), layer by layer: embeddings,
        layers up to the deepest of them, and only those exits' heads (eval mode)."""
        heads = [self.heads[i] for i in indices]
        return forward_to_exits(
            self.layer_runner(),
            heads,
            input_ids,
            attention_mask,
            token_type_ids,
            skip_unpadded_mask,
        )

    def label_embeddings(self) -> torch.Tensor:
        """Label embedding of each class at each exit, ``[E, C, D]`` (docs/methods.md, Notation)."""
        if self.spec.label_embedding == "separate":
            return torch.stack([head.label_table for head in self.heads])
        return torch.stack([head.classifier.weight for head in self.heads])

    def parameter_groups(self) -> dict[str, list[str]]:
        """Names of the parameters in each group a method stage can train."""
        last = f"heads.{self.num_exits - 1}."
        groups: dict[str, list[str]] = {"encoder": [], "final_exit": [], "inner_exits": []}
        for name, _ in self.named_parameters():
            if name.startswith("encoder."):
                groups["encoder"].append(name)
            elif name.startswith(last):
                groups["final_exit"].append(name)
            else:
                groups["inner_exits"].append(name)
        return groups

    base_model: str | None = None  # model.name as the user gave it; load_multi_exit sets it

    def save(self, folder: Path, base_model: str | None = None) -> None:
        """Write ``model.safetensors`` and ``aclpipe_model.json`` into ``folder``.

        ``base_model`` (default: the one this model was loaded with) is recorded as given, in
        place of the encoder config's ``_name_or_path``: that is where transformers read the
        encoder from, a folder of this machine, which would make the same run differ by machine.
        """
        folder.mkdir(parents=True, exist_ok=True)
        save_model(self, str(folder / WEIGHTS))
        encoder = self.encoder.config.to_dict()
        encoder.pop("_name_or_path", None)
        config = {
            "base_model": base_model or self.base_model,
            "spec": asdict(self.spec),
            "encoder": encoder,
        }
        (folder / MODEL_CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")


def build_model(encoder: nn.Module, spec: ExitSpec) -> MultiExitModel:
    return MultiExitModel(encoder, spec)


def load_multi_exit(folder: Path) -> MultiExitModel:
    """Load a model written by ``MultiExitModel.save`` (weights only; no code is executed)."""
    from transformers import AutoConfig, AutoModel

    config_path, weights = folder / MODEL_CONFIG, folder / WEIGHTS
    if not config_path.exists() or not weights.exists():
        raise UserError(
            f"no trained model in {folder} (missing {MODEL_CONFIG} or {WEIGHTS}): "
            "run `aclpipe finetune` for this task and method first"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        encoder_config = dict(config["encoder"])  # older files also hold _name_or_path
        model_type = encoder_config.pop("model_type")
        encoder = AutoModel.from_config(AutoConfig.for_model(model_type, **encoder_config))
        model = MultiExitModel(encoder, ExitSpec(**config["spec"]))
        model.base_model = config.get("base_model")
        missing, unexpected = load_model(model, str(weights), strict=False)
    except (SafetensorError, json.JSONDecodeError, KeyError, TypeError, ValueError, OSError) as err:
        raise UserError(
            f"model in {folder} is damaged or truncated ({type(err).__name__}): "
            "delete the folder and run `aclpipe finetune` again"
        ) from err
    missing = [m for m in missing if "position_ids" not in m]
    if missing or unexpected:
        raise UserError(
            f"weights in {weights} do not match its config (missing {missing[:2]}, "
            f"unexpected {list(unexpected)[:2]}): run `aclpipe finetune` again"
        )
    return model
