"""The model, shared by training and inference: finding a pretrained encoder (``backbone``),
poolers (``pooling``), the multi-exit model (``model``) and padding rows into batches
(``batching``). Nothing here trains, prepares data or scores."""
