"""Training objectives, one per file, each a plain function returning a scalar loss."""

from __future__ import annotations

from aclpipe.training.objectives.acl_embed import acl_embed_loss
from aclpipe.training.objectives.cosine_pairs import cosine_pairs_loss
from aclpipe.training.objectives.cross_layer import cross_layer_acl_loss
from aclpipe.training.objectives.scl import scl_loss
from aclpipe.training.objectives.self_distill import distill_kl, self_distill_loss
from aclpipe.training.objectives.simcse_sup import simcse_sup_loss
from aclpipe.training.objectives.simcse_unsup import simcse_unsup_loss
from aclpipe.training.objectives.supcon import supcon

__all__ = [
    "acl_embed_loss",
    "cosine_pairs_loss",
    "cross_layer_acl_loss",
    "distill_kl",
    "scl_loss",
    "self_distill_loss",
    "simcse_sup_loss",
    "simcse_unsup_loss",
    "supcon",
]
