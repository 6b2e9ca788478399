"""Evaluation: GLUE metrics (``metrics``), all-exit logits, per-exit scores and the score of an
exit setting (``scoring``), and the evaluate stage (``evaluate``)."""
