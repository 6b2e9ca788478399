"""A multi-exit model cut into graphs a runtime can chain: embeddings, then one segment per exit.

``EmbeddingsGraph``: ``input_ids, attention_mask[, token_type_ids] [B, T] -> states
[1, B, T, H]`` (``h_0``). ``SegmentGraph`` ``j``: the layers between exit ``j-1`` and exit
``j`` (``e_{j-1} + 1 .. e_j``, with ``e_0 = 0``) and exit ``j``'s head:
``states, attention_mask -> states, logits [B, C]``.

``states`` carries what the heads downstream read: ``h_k`` alone (``[1, B, T, H]``) for
poolings that read the last hidden state (cls, mean), and ``h_0..h_k`` (``[k+1, B, T, H]``)
for layer-attention, which pools over every layer computed so far (docs/methods.md, Pooling).
Its batch and sequence axes (1 and 2) are dynamic; a runtime drops finished rows and trailing
padding columns from ``states`` and the mask alike.

Segments take the 0/1 attention mask and build what their layers need inside (the additive
mask for BERT-likes, MPNet's position bias, DeBERTa's pair mask and relative positions) through
the model's ``LayerRunner`` (``aclpipe.modeling.layerwise``), always with the mask: a graph
cannot branch on whether a batch has padding. Each graph holds only the modules it runs, so a
segment carries no embedding matrix and no other exit's head.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from aclpipe.errors import UserError
from aclpipe.layout import EMBEDDINGS_ONNX, segment_file
from aclpipe.modeling.layer_guard import check_layerwise
from aclpipe.modeling.model import MultiExitModel

EMBEDDINGS = EMBEDDINGS_ONNX
# |onnx - torch| per tensor, at most this times max(1, max |torch|). Measured on the tiny
# random BERT and on all-MiniLM-L6-v2 (SST-2 dev rows): about 1e-6 on logits and states.
TOLERANCE = 1e-4


def carries_all_layers(model: MultiExitModel) -> bool:
    """True when some head pools over ``h_0..h_k`` (layer-attention): ``states`` then holds all."""
    return any(head.pooler.reads_all_layers for head in model.heads)


def exportable(head: nn.Module) -> nn.Module:
    """``head``, or a copy with every ``RReLU`` as the ``LeakyReLU`` it is in eval mode (slope
    ``(lower + upper) / 2``): the exporter has no ONNX op for RReLU's noise (layer-attention)."""
    if not any(isinstance(m, nn.RReLU) for m in head.modules()):
        return head
    head = copy.deepcopy(head).eval()
    for module in list(head.modules()):
        for name, child in module.named_children():
            if isinstance(child, nn.RReLU):
                setattr(module, name, nn.LeakyReLU((child.lower + child.upper) / 2))
    return head


class EmbeddingsGraph(nn.Module):
    """``h_0`` as ``states [1, B, T, H]``: the embeddings (and ELECTRA's projection)."""

    def __init__(self, model: MultiExitModel, use_token_types: bool) -> None:
        super().__init__()
        check_layerwise(model)
        self.runner = model.layer_runner()  # a plain object: its modules are registered below
        self.embeddings = self.runner.encoder.embeddings
        if self.runner.project is not None:
            self.project = self.runner.project
        self.use_token_types = use_token_types

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        types = token_type_ids if self.use_token_types else None
        hidden = self.runner.embed(input_ids, attention_mask, types)  # [B, T, H]
        return hidden.unsqueeze(0)  # [1, B, T, H]


class SegmentGraph(nn.Module):
    """Layers ``start + 1 .. exit layer`` and the head of exit ``index``."""

    def __init__(self, model: MultiExitModel, index: int) -> None:
        super().__init__()
        check_layerwise(model)
        runner = model.layer_runner()
        self.runner = runner
        self.head = exportable(model.heads[index])
        self.start = model.heads[index - 1].layer if index > 0 else 0
        self.end = self.head.layer
        for name, module in runner.modules(self.end).items():
            if name not in ("embeddings", "embeddings_project", "layers"):
                self.add_module(name, module)  # what layers read besides hidden (MPNet, DeBERTa)
        self.layers = nn.ModuleList(runner.layers[self.start : self.end])  # used by the calls
        self.calls = runner.calls[self.start : self.end]
        self.carry_all = carries_all_layers(model)

    def forward(
        self, states: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = states[-1]  # [B, T, H], h_start
        inputs = self.runner.inputs(hidden, attention_mask)
        kept = list(states.unbind(0)) if self.carry_all else [hidden]
        for call in self.calls:
            hidden = call(hidden, inputs)  # [B, T, H]
            kept = kept + [hidden] if self.carry_all else [hidden]
        logits = self.head.logits(kept, attention_mask)  # [B, C]
        out = torch.stack(kept) if self.carry_all else hidden.unsqueeze(0)  # [S, B, T, H]
        return out, logits


def torch_chain(
    embeddings: EmbeddingsGraph, segments: list[SegmentGraph], batch: dict[str, torch.Tensor]
) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """The chain in PyTorch: ``(h_0 states, None)``, then ``(states, logits)`` per segment."""
    with torch.no_grad():  # not inference mode: the states are also the exporter's examples
        states = embeddings(**batch)  # [1, B, T, H]
        steps: list[tuple[torch.Tensor, torch.Tensor | None]] = [(states, None)]
        for segment in segments:
            states, logits = segment(states, batch["attention_mask"])  # [S, B, T, H], [B, C]
            steps.append((states, logits))
    return steps


def export_graph(module: nn.Module, example: dict, path: Path, outputs: list[str],
                 dynamic: dict, what: str, opset: int | None = None) -> None:  # fmt: skip
    """One graph with dynamic axes (``torch.export`` based), or a one-line error naming it."""
    try:
        with quiet_exporter():
            torch.onnx.export(
                module,
                (),
                str(path),
                kwargs=example,
                input_names=list(example),
                output_names=outputs,
                opset_version=opset,
                dynamo=True,
                dynamic_shapes=dynamic,
                external_data=False,  # one self-contained file per graph (models under 2 GB)
            )
    except Exception as err:  # the exporter raises many types; the user needs one line
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        raise UserError(f"ONNX export of {what} failed: {type(err).__name__}: {reason}") from err


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the exporter's progress lines, warnings and registry chatter."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def write_segments(model: MultiExitModel, names: list[str], batches: list[dict], folder: Path,
                   what: str, opset: int | None = None) -> dict:  # fmt: skip
    """Export ``embeddings.onnx`` and ``segment_<layer>.onnx`` per exit into ``folder``, then
    check them with onnxruntime against PyTorch on ``batches`` (real dev rows, padded).

    Each graph is fed the PyTorch states it follows, and its outputs compared with PyTorch's
    (states and logits); the ONNX chain, each segment fed the previous ONNX output, is compared
    with the model's forward logits at every exit. A difference above ``TOLERANCE`` times
    ``max(1, max |reference|)`` is a ``UserError``. Returns the export.json entries.
    """
    from torch.export import Dim

    embeddings = EmbeddingsGraph(model, "token_type_ids" in names).eval()
    segments = [SegmentGraph(model, i).eval() for i in range(model.num_exits)]
    references = [torch_chain(embeddings, segments, batch) for batch in batches]
    with torch.no_grad():
        forward = [model(**batch).logits for batch in batches]  # [E, b, C] each
    batch_axis, tokens = Dim("batch"), Dim("sequence")
    example = batches[0]
    export_graph(embeddings, example, folder / EMBEDDINGS, ["states"],
                 {n: {0: batch_axis, 1: tokens} for n in example}, f"the embeddings ({what})", opset)  # fmt: skip
    files = []
    for i, segment in enumerate(segments):
        files.append(segment_file(segment.end))
        inputs = {"states": references[0][i][0], "attention_mask": example["attention_mask"]}
        dynamic = {
            "states": {1: batch_axis, 2: tokens},
            "attention_mask": {0: batch_axis, 1: tokens},
        }
        export_graph(segment, inputs, folder / files[-1], ["states_out", "logits"], dynamic,
                     f"exit {segment.end}'s segment ({what})", opset)  # fmt: skip
    sessions = [open_session(folder / name) for name in (EMBEDDINGS, *files)]
    gaps = Gaps()
    for batch, steps, expected in zip(batches, references, forward):
        mask = batch["attention_mask"].numpy()
        feed = {n: batch[n].numpy() for n in session_inputs(sessions[0])}
        (chained,) = run_graph(sessions[0], feed, "the embeddings")  # [1, b, T, H]
        gaps.add("embeddings", chained, steps[0][0])
        for i, session in enumerate(sessions[1:]):
            what_i = f"exit {segments[i].end}'s segment"
            alone = run_graph(
                session, {"states": steps[i][0].numpy(), "attention_mask": mask}, what_i
            )
            gaps.add(f"{files[i]} states", alone[0], steps[i + 1][0])
            gaps.add(f"{files[i]} logits", alone[1], steps[i + 1][1])
            chained, logits = run_graph(
                session, {"states": chained, "attention_mask": mask}, what_i
            )
            gaps.add(f"chain to exit {segments[i].end}", logits, expected[i])
    segment_records = [
        {"file": name, "layers": [s.start + 1, s.end], "exit": s.end,
         "max_abs_diff_states": gaps.worst[f"{name} states"],
         "max_abs_diff_logits": gaps.worst[f"{name} logits"],
         "chain_max_abs_diff_logits": gaps.worst[f"chain to exit {s.end}"]}
        for name, s in zip(files, segments)
    ]  # fmt: skip
    return {
        "embeddings": {"file": EMBEDDINGS, "inputs": names,
                       "max_abs_diff_states": gaps.worst["embeddings"]},
        "segments": segment_records,
        "states": "all" if carries_all_layers(model) else "last",
        "tolerance": TOLERANCE,
    }  # fmt: skip


class Gaps:
    """The largest ``|onnx - torch|`` per name; a ``UserError`` above the tolerance."""

    def __init__(self) -> None:
        self.worst: dict[str, float] = {}

    def add(self, name: str, got: np.ndarray, reference: torch.Tensor) -> None:
        expected = reference.detach().float().numpy()
        if got.shape != expected.shape:
            raise UserError(f"ONNX {name} has shape {got.shape}, PyTorch {expected.shape}: "
                            "export again, or report this model type as unsupported")  # fmt: skip
        gap = float(np.abs(got - expected).max())
        limit = TOLERANCE * max(1.0, float(np.abs(expected).max()))
        if not gap <= limit:  # also catches NaN
            raise UserError(
                f"ONNX {name} differs from PyTorch by {gap:.2e} > {limit:.1e} on dev rows: "
                "the exported graph is wrong for this model; use --engine torch with predict"
            )
        self.worst[name] = max(self.worst.get(name, 0.0), gap)


def open_session(path: Path):
    """The graph in a session configured as the runtime's (``onnx_runtime.open_session``), so
    the check below measures what ``predict`` runs."""
    from aclpipe.early_exit.onnx_runtime import open_session as runtime_session

    try:
        return runtime_session(path)
    except Exception as err:  # onnxruntime's errors carry C++ detail over many lines
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        raise UserError(f"onnxruntime cannot load {path.name}: {reason}") from err


def session_inputs(session) -> list[str]:
    return [i.name for i in session.get_inputs()]


def run_graph(session, feed: dict, what: str) -> list[np.ndarray]:
    try:
        return session.run(None, feed)
    except Exception as err:
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        raise UserError(f"onnxruntime cannot run {what}: {reason}") from err
