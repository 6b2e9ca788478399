"""The pipeline's stages (dvc.yaml): ``prepare``, ``finetune``, ``evaluate``, ``export`` (with
its int8 step) and ``tradeoff`` (every method's speed within a score budget, with its tables
and plots), each reading its own params.yaml section and calling the library with explicit
arguments; only they write the stage's files. Nothing below imports them."""
