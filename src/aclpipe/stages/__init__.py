"""The pipeline's stages (dvc.yaml): ``prepare``, ``finetune``, ``evaluate`` and ``export``
(with its int8 step), each reading its own params.yaml section and calling the library with
explicit arguments; only they write the stage's files. Nothing below imports them."""
