"""Early exit, served: pure per-sample exit policies (``policies``), exit settings
(``settings``), the layer-by-layer runtimes on PyTorch (``runtime``, ``torch_engine``) and
ONNX Runtime (``onnx_runtime``), input reading and tokenizing (``inputs``, ``tokens``),
prediction (``predict``), the HTTP server (``serve``: request bodies read and checked by
``bodies``, batched by ``scheduler`` or ``iteration``) and thresholds retuned from a shadow
sample (``shadow``, ``recalibrate``, run live by ``watch``); nothing here trains, prepares data or scores. The files
it serves are made by ``aclpipe.exits``."""
