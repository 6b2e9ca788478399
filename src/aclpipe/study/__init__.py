"""The studies built on the library and the pipeline, one subpackage each, over one shared
statistics core: ``stats`` (run measures, the paired bootstrap, verdicts and Holm's step-down),
``campaign`` (the seeds campaign: plan, runners, tuning, report), ``fewshot`` (the few-shot
study: a campaign with N as one more axis, and its report), ``sts`` (the STS study and
zero-shot sentence embeddings), and ``angles`` (the gradient-angle experiment). ``cli`` is the
studies' command table; nothing in the library or the pipeline imports a study."""
