"""The study built on the library: the seeds campaign (``campaign``, ``campaign_runner``,
``campaign_report``), speed-quality tables and plots (``tradeoff``, ``tradeoff_plots``), the
gradient-angle experiment (``angles``) and zero-shot sentence embeddings (``sts_eval``)."""
