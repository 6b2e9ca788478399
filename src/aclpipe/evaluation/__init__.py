"""Evaluation: GLUE metrics (``metrics``), all-exit logits and per-exit scores (``scoring``)
and the evaluate stage (``evaluate``)."""
