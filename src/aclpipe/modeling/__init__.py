"""The model, shared by training and inference: finding a pretrained encoder (``backbone``),
poolers (``pooling``), the multi-exit model (``model``, with ``forward_to_exits``), the
per-family runners of an encoder layer by layer (``layerwise``, below the model), the check
that they reproduce the model's forward (``layer_guard``, above it), its knobs (``config``),
padding rows into batches (``batching``) and where it runs (``device``). Nothing here trains,
prepares data or scores."""
