"""The statistics every study shares: run measures and budgets (``measures``), the paired
bootstrap over seeds and examples (``paired``), verdicts and Holm's step-down (``verdicts``)."""
