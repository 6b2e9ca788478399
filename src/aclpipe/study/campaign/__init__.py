"""The seeds campaign: its plan (``plan``), the runs' runners (``runner`` over ``backends`` and
``ray_backend``), the base recipe's tuning (``tuning``), the DVC record (``record``), the stack
check (``stack_check``), the leak-free rows (``leak_free``), and its report (``report`` with
``markdown``, ``overview``, ``speed``, ``plots``); ``commands`` is what its CLI calls."""
