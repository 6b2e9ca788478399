"""The early-exit loop both engines run: decide per sample, let finished samples go, trim padding.

``run_exits`` is written once for the PyTorch runtime (``early_exit.runtime``) and the ONNX
Runtime one (``early_exit.onnx_runtime``). An engine hands it one batch's pass (``ExitPass``):
the logits at the next exit for the samples still running, and how to go on with fewer rows
and fewer padding columns. After each exit but the last, ``policies.step`` decides sample by
sample who leaves; their logits and exit are recorded in their original positions, they leave
the batch, and padding columns only they needed are trimmed (batches are right-padded).

The two steps every exit takes, ``decide`` (who leaves) and ``keep_running`` (the rest go on,
trimmed), are public: the iteration scheduler (``early_exit.iteration``) runs them per cohort,
so it decides and trims exactly as this loop does.

The arrays are the engine's own (torch tensors or NumPy arrays). Indexing, ``~`` and
assignment through an index read the same in both; the four operations spelled differently
come in an ``ArrayOps`` (``NUMPY_OPS`` here, ``TORCH_OPS`` in ``runtime``). This module
imports no torch: a serving box runs it with NumPy alone.

The decision stays plain Python over one ``tolist()`` per exit (``policies``'s docstring says
why), and a batch whose samples all leave at one exit (always so at batch 1) takes no array
operation beyond building its exit index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from aclpipe.early_exit.policies import NO_EXIT, step

Array = Any  # a torch.Tensor or an np.ndarray, the engine's kind throughout


@dataclass
class EarlyExitResult:
    logits: Array  # [B, C] float32, the logits at the exit each sample left by
    exit_index: Array  # [B] int64, 0-based index into the exits
    exit_layer: Array  # [B] int64, the 1-based layer of that exit


class ArrayOps(NamedTuple):
    """The array operations that torch and NumPy spell differently."""

    full: Callable[[int, int], Array]  # (n, value) -> [n] int64, every entry value
    empty_rows: Callable[[int, Array], Array]  # (n, rows [b, C]) -> [n, C] of rows' dtype
    arange: Callable[[int], Array]  # n -> [n] int64, 0 .. n-1
    flags: Callable[[list[bool]], Array]  # Python booleans -> a boolean index [n]


NUMPY_OPS = ArrayOps(
    full=lambda n, value: np.full(n, value, dtype=np.int64),
    empty_rows=lambda n, rows: np.empty((n, rows.shape[1]), dtype=rows.dtype),
    arange=np.arange,
    flags=np.array,
)


class ExitPass(Protocol):
    """One batch on its way through an engine's layers, exit by exit."""

    mask: Array  # [b, T] 0/1, the attention mask of the samples still running

    def logits(self, k: int) -> Array:
        """Run the running samples on to exit ``k`` (0-based); its logits ``[b, C]``."""
        ...

    def keep(self, stay: Array, mask: Array) -> None:
        """Go on with rows ``stay`` (a boolean index ``[b]``) only, whose mask is now ``mask``
        ``[b', T']`` (``T'`` the longest of them: later columns are padding)."""
        ...


def decide(
    k: int,
    last_exit: int,
    logits: Array,  # [b, C], the running rows' logits at exit k
    seen: list[list[list[float]]],  # per running row, its policy window (policies.step)
    policy: str,
    threshold: float | None,
    window: int,
    regression: bool,
    eps: float,
) -> tuple[list[list[list[float]]], list[bool]]:
    """Who of the running rows leaves at exit ``k`` (0-based), and their windows with this
    exit's logits: at the last exit everyone; under ``NO_EXIT`` nobody before it (windows
    unread, left as they are); otherwise ``policies.step`` over one ``tolist()``."""
    if k == last_exit:
        return seen, [True] * len(logits)
    if policy == NO_EXIT:
        return seen, [False] * len(logits)
    # one tolist() and plain Python: see aclpipe.early_exit.policies
    return step(policy, threshold, seen, logits.tolist(), window, regression, eps)


def keep_running(run: ExitPass, stay: Array) -> None:
    """``run`` goes on with rows ``stay`` (a boolean index ``[b]``, at least one True) only,
    its mask cut to the longest of them: the later columns are padding that only the rows
    leaving needed (batches are right-padded)."""
    mask = run.mask[stay]  # [b', T]
    longest = int(mask.sum(1).max())
    run.keep(stay, mask[:, :longest])


def run_exits(
    run: ExitPass,
    ops: ArrayOps,
    exit_layers: Array,  # [E] int64, the 1-based layer of each exit
    policy: str,
    threshold: float | None,
    window: int,  # how many of a sample's newest exits the policy reads (policies.window_size)
    regression: bool,
    eps: float,
    on_exit: Callable | None = None,
) -> EarlyExitResult:
    """Early exit of one batch: each sample's logits at the exit it left by, in input order.
    ``policy`` ``NO_EXIT`` runs every sample to the last exit. ``on_exit(k, positions, logits,
    leaving, run)``, when given, sees every exit before its rows leave: the original positions
    of the rows running, their logits ``[b, C]``, who leaves, and the pass (the server's shadow
    sample keeps a picked row's states there, ``early_exit.watch``)."""
    batch, last_exit = len(run.mask), len(exit_layers) - 1
    out_logits: Array | None = None  # filled when a first sample leaves
    out_index: Array | None = None
    active: Array | None = None  # original positions of those running; None = all
    seen: list[list[list[float]]] = [[] for _ in range(batch)]  # per sample, its last
    # `window` exits' logits (patience t reads t + 1 of them, the others the newest one)
    for k in range(last_exit + 1):
        logits = run.logits(k)  # [b, C]
        seen, decided = decide(k, last_exit, logits, seen, policy, threshold, window,
                               regression, eps)  # fmt: skip
        if on_exit is not None:
            on_exit(k, range(batch) if active is None else active.tolist(), logits, decided, run)
        leaving = sum(decided)
        if leaving == len(decided):  # everyone still running leaves (always at the last exit;
            # an empty batch at its first: empty arrays of the engine's kind)
            if active is None:  # nobody left earlier: this exit's logits are the answer
                out_index = ops.full(batch, k)
                return EarlyExitResult(logits, out_index, exit_layers[out_index])
            out_logits[active], out_index[active] = logits, k
            break
        if leaving == 0:
            continue
        if active is None:
            out_logits, out_index = ops.empty_rows(batch, logits), ops.full(batch, last_exit)
            active = ops.arange(batch)
        leave = ops.flags(decided)
        out_logits[active[leave]], out_index[active[leave]] = logits[leave], k
        stay = ~leave
        active = active[stay]
        keep_running(run, stay)
        seen = [w for w, gone in zip(seen, decided) if not gone]
    return EarlyExitResult(out_logits, out_index, exit_layers[out_index])
