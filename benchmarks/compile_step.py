"""Does ``torch.compile`` pay for training on this machine? Eager against compiled, same steps.

MiniLM-L6 (the offline default) as the loop builds it for ``ce`` (``MultiExitModel``, fused
AdamW from ``build_optimizer``), trained on ``--steps`` length-grouped batches of real SST-2
(the loop's own ``epoch_order`` with grouping, so the widths vary from batch to batch as in
training). Eager and compiled (``torch.compile(model, dynamic=True)``, inductor; dynamic so
that a new width does not recompile) run one after the other from the same initial weights.
Reported: the compiled run's first step (compilation included), its later steps against
eager's, and how many steps compilation needs to pay for itself. Whole steps are timed:
forward, loss, backward, clip, optimiser step.

    python benchmarks/compile_step.py [--steps 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from threads import add_threads_option, apply_threads  # noqa: E402

from aclpipe import atomic  # noqa: E402
from aclpipe.config import DEFAULT_MODEL, params_from_dict  # noqa: E402
from aclpipe.data.prepared import load_split  # noqa: E402
from aclpipe.data.tasks import get_task  # noqa: E402
from aclpipe.modeling.backbone import load_encoder  # noqa: E402
from aclpipe.modeling.batching import collate  # noqa: E402
from aclpipe.modeling.model import ExitSpec, MultiExitModel  # noqa: E402
from aclpipe.stages.prepare import prepare  # noqa: E402
from aclpipe.training.batch_order import epoch_order  # noqa: E402
from aclpipe.training.loop import build_optimizer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def step_times(model: torch.nn.Module, forward, batches: list[dict], params) -> list[float]:
    """Seconds of each training step (forward, CE on the last exit, backward, clip, step)."""
    optimizer = build_optimizer(model, ("encoder", "final_exit"), params.train)
    model.train()
    times = []
    for batch in batches:
        started = time.perf_counter()
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        logits = forward(**inputs).logits  # [E, B, C]
        loss = F.cross_entropy(logits[-1], batch["labels"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--glue-dir", type=Path, default=REPO.parent / "shared" / "glue")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "compile_step.json"
    )
    add_threads_option(parser)
    args = parser.parse_args()
    threads = apply_threads(args.threads)
    samples = args.steps * args.batch_size
    params = params_from_dict(
        {
            "data": {
                "glue_dir": str(args.glue_dir),
                "max_length": 64,
                "max_train_samples": samples,
            },
            "train": {"batch_size": args.batch_size, "device": "cpu"},
        }
    )
    task = get_task("sst2")
    with tempfile.TemporaryDirectory() as folder:
        prepare(task, params.data, DEFAULT_MODEL, Path(folder), args.glue_dir)
        rows = load_split(Path(folder), "train")
    order = epoch_order([len(r["input_ids"]) for r in rows], args.batch_size, 42, 0, 0, True)
    batches = [
        collate([rows[i] for i in order[s : s + args.batch_size]], 0, False)
        for s in range(0, len(order), args.batch_size)
    ]
    torch.manual_seed(0)
    encoder = load_encoder(DEFAULT_MODEL)
    spec = ExitSpec(num_labels=2, exits=[encoder.config.num_hidden_layers], pooling="mean",
                    dropout=0.1)  # fmt: skip
    eager_model = MultiExitModel(encoder, spec)
    compiled_model = copy.deepcopy(eager_model)
    torch.manual_seed(1)
    eager = step_times(eager_model, eager_model, batches, params)
    torch.manual_seed(1)
    compiled = step_times(
        compiled_model, torch.compile(compiled_model, dynamic=True), batches, params
    )
    eager_step = statistics.median(eager[1:])
    compiled_step = statistics.median(compiled[1:])
    overhead = compiled[0] - eager[0]
    saved = eager_step - compiled_step
    record = {
        "benchmark": "compile_step",
        "command": f"python benchmarks/compile_step.py --steps {args.steps} --threads {args.threads}",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": threads,
        "widths": [b["input_ids"].shape[1] for b in batches],
        "eager_s": eager,
        "compiled_s": compiled,
        "eager_median_step_s": eager_step,
        "compiled_median_step_s": compiled_step,
        "compiled_over_eager_step": compiled_step / eager_step,
        "first_step_overhead_s": overhead,
        "break_even_steps": overhead / saved if saved > 0 else None,
    }
    print(json.dumps({k: v for k, v in record.items() if not k.endswith("_s")}, indent=2))
    print(f"eager first step {eager[0]:.2f}s, compiled first step {compiled[0]:.2f}s")
    atomic.write_text(args.out, json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
