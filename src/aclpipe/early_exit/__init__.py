"""Early exit: pure per-sample exit policies (``policies``), the layer-by-layer runtime
(``runtime``) and prediction (``predict``), which serve without the training stack; the
export stage (``export``) and the timed policy sweeps (``sweep``), which read prepared data."""
