"""The STS study (``study``: its plan and runs, scored by ``scores``; its report ``report``
with ``markdown``) and zero-shot sentence embeddings by layer and pooling (``embeddings``)."""
