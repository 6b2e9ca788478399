"""aclpipe: contrastive and multi-exit fine-tuning of BERT-family encoders on GLUE."""

__version__ = "0.1.0"
