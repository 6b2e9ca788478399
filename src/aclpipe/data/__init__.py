"""Data: the GLUE task table (``tasks``), readers of local and hub GLUE (``glue_sources``),
the prepare stage (``prepare``) and reading prepared splits back (``prepared``)."""
