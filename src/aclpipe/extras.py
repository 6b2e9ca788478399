"""Which optional install a missing module belongs to (pyproject.toml's extras).

``pip install aclpipe`` is the torch-free serving path (``predict --engine onnx``, ``serve``);
everything else names its extra in one line when a module of it is missing, instead of a
traceback.
"""

from __future__ import annotations

from aclpipe.errors import UserError

EXTRA_OF_MODULE = {
    **dict.fromkeys(
        (
            "torch",
            "transformers",
            "datasets",
            "accelerate",
            "safetensors",
            "sklearn",
            "scipy",
            "onnx",
            "onnxscript",
            "dvclive",
        ),
        "train",
    ),  # fmt: skip
    "dvc": "pipeline",
    "matplotlib": "pipeline",
    "ray": "cluster",
}


def missing_extra(err: ModuleNotFoundError) -> UserError | None:
    """The one-line error for a module an extra installs; None for any other missing module
    (a broken install, not a missing option)."""
    top = (err.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    return UserError(
        f"this needs {top}, which the core install leaves out: pip install 'aclpipe[{extra}]'"
    )
