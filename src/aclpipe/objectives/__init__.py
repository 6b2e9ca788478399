"""Training objectives, one per file, each a plain function returning a scalar loss."""

from __future__ import annotations

from aclpipe.objectives.acl_embed import acl_embed_loss
from aclpipe.objectives.cross_layer import cross_layer_acl_loss
from aclpipe.objectives.scl import scl_loss
from aclpipe.objectives.self_distill import distill_kl, self_distill_loss
from aclpipe.objectives.supcon import supcon

__all__ = [
    "acl_embed_loss",
    "cross_layer_acl_loss",
    "distill_kl",
    "scl_loss",
    "self_distill_loss",
    "supcon",
]
