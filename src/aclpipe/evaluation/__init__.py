"""Evaluation: GLUE metrics (``metrics``), all-exit logits, per-exit scores and the score of an
exit setting (``scoring``) and the caveats printed beside them (``caveats``); the evaluate
stage that writes them is ``aclpipe.stages.evaluate``."""
