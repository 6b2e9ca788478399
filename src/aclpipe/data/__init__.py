"""Data: the GLUE task table (``tasks``), readers of local and hub GLUE (``glue_sources``) and
reading prepared splits back (``prepared``); the prepare stage is ``aclpipe.stages.prepare``."""
