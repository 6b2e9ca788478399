"""Training: the written-out loop (``loop``), methods as data (``methods``), one objective per
file (``objectives``), gradient rules (``grad_rules``), resumable checkpoints
(``checkpoint``), each epoch's order of rows, plain or grouped by length (``batch_order``),
multi-process helpers (``distributed``) and the progress display (``progress``)."""
