"""The model, shared by training and inference: finding a pretrained encoder (``backbone``),
poolers (``pooling``), the multi-exit model (``model``), running its encoder layer by layer
as its forward does (``layerwise``), padding rows into batches (``batching``) and where it runs
(``device``). Nothing here trains, prepares data or scores."""
