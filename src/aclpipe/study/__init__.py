"""The study built on the library: the seeds campaign (``campaign``, ``campaign_runner``
with its backends, ``backends`` and ``ray_backend``, ``tuning``; its report ``campaign_report`` with ``campaign_markdown`` and ``campaign_plots``,
on the run measures of ``measures`` and the paired statistics of ``paired``), speed-quality tables and plots (``tradeoff``,
``tradeoff_plots``), the gradient-angle experiment (``angles``), zero-shot sentence
embeddings (``sts_eval``) and the STS study (``sts_study``, ``sts_scores``; its report
``sts_report`` with ``sts_markdown``, judged by ``verdicts``)."""
