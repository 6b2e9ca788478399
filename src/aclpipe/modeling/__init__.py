"""The model, shared by training and inference: finding a pretrained encoder (``backbone``),
poolers (``pooling``), the multi-exit model (``model``), running its encoder layer by layer
as its forward does (``layerwise``) and padding rows into batches (``batching``). Nothing here trains, prepares data or scores."""
