"""``predict``'s PyTorch engine: the early-exit runtime on a saved model, NumPy in and out.

The model folder is an export's ``model/`` or a training folder. ``policy="none"`` runs the
full model to its deepest exit with that exit's head only (``runtime.full_forward``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from aclpipe.early_exit.policies import NO_EXIT
from aclpipe.early_exit.runtime import EarlyExitRuntime, full_forward
from aclpipe.modeling.model import load_multi_exit


class TorchEngine:
    def __init__(
        self, model_dir: Path, policy: str, threshold: float | None, threads: int | None = None
    ) -> None:
        if threads:
            torch.set_num_threads(threads)  # process-wide: torch has no per-model setting
        self.model = load_multi_exit(model_dir).eval()
        self.num_labels = self.model.spec.num_labels
        self.exits = list(self.model.spec.exits)
        self.regression = self.num_labels == 1
        self.pad_id = self.model.encoder.config.pad_token_id or 0
        self.runtime = None
        if policy != NO_EXIT:
            self.runtime = EarlyExitRuntime(
                self.model, policy, threshold, regression=self.regression
            )  # checks the policy and threshold

    def __call__(self, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``(logits [B, C], exit layer [B])`` for padded ``input_ids``, ... ``[B, T]``."""
        batch = {name: torch.from_numpy(array) for name, array in arrays.items()}
        if self.runtime is None:
            logits = full_forward(self.model, **batch)  # [B, C]
            return logits.numpy(), np.full(len(logits), self.exits[-1], dtype=np.int64)
        result = self.runtime(**batch)
        return result.logits.float().numpy(), result.exit_layer.numpy()
