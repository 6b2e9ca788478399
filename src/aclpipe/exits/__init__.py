"""Exits offline: a trained model cut into ONNX segments and exported (``export``,
``segments``), their int8 copies (``quantize``) and the timed policy sweeps (``sweep``); what
``early_exit`` serves is made here."""
