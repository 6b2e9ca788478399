"""aclpipe: contrastive and multi-exit fine-tuning of BERT-family encoders on GLUE."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("aclpipe")  # pyproject.toml holds the one copy
except PackageNotFoundError:  # a source tree on PYTHONPATH, never installed
    __version__ = "0+unknown"
