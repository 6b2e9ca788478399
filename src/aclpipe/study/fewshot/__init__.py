"""The few-shot study: a campaign (``aclpipe.study.campaign``) with N as one more axis; its
report (``report`` with ``markdown`` and ``plots``) and its wall-clock ledger (``wallclock``)."""
